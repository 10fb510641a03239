-- Put a claimed ticket back to pending; a pending or final one stays.
-- KEYS[1] the ticket's hash. Returns nil for no ticket, else 1.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
if redis.call('HGET', KEYS[1], 'state') == '2' then
  redis.call('HSET', KEYS[1], 'state', '1')
  redis.call('HDEL', KEYS[1], 'claim')
end
return 1
