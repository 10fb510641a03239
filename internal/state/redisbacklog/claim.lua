-- Claim a ticket if it is pending (a cancel through another replica wins).
-- KEYS[1] the ticket's hash. ARGV[1] the claim as JSON, ARGV[2] its lease
-- id in decimal (kept apart: Lua's numbers do not hold 64 bits).
-- Returns nil for no ticket, else {1 if claimed now or 0, its fields}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local ok = 0
if redis.call('HGET', KEYS[1], 'state') == '1' then
  redis.call('HSET', KEYS[1], 'state', '2', 'claim', ARGV[1], 'lease', ARGV[2])
  ok = 1
end
return {ok, redis.call('HGETALL', KEYS[1])}
