-- Put a ticket claimed with a lease back to pending; a pending or final
-- one stays, and so does one claimed with another lease (by a replica
-- that adopted it). A claim written without its lease apart matches.
-- KEYS[1] the ticket's hash. ARGV[1] the lease id in decimal.
-- Returns nil for no ticket, else 1.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local lease = redis.call('HGET', KEYS[1], 'lease')
if redis.call('HGET', KEYS[1], 'state') == '2' and (not lease or lease == ARGV[1]) then
  redis.call('HSET', KEYS[1], 'state', '1')
  redis.call('HDEL', KEYS[1], 'claim', 'lease')
end
return 1
