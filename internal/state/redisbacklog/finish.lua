-- Finish a ticket: final state on its hash, kept for the retention; its
-- entry acknowledged and deleted. A ticket already final stays as it is,
-- and so does a claimed one asked to be cancelled (its worker runs it):
-- deferral.State.Finishes.
-- KEYS[1] the ticket's hash, KEYS[2] its shard's stream.
-- ARGV[1] state, ARGV[2] reason, ARGV[3] finished (RFC 3339),
-- ARGV[4] retention in ms, ARGV[5] the group.
-- Returns nil for no ticket, 1 when finished now, 0 when it was final.
local st = redis.call('HGET', KEYS[1], 'state')
if not st then
  return false
end
if tonumber(st) >= 3 or (ARGV[1] == '5' and st == '2') then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'finished', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local sid = redis.call('HGET', KEYS[1], 'sid')
redis.pcall('XACK', KEYS[2], ARGV[5], sid) -- NOGROUP if Redis lost the stream
redis.call('XDEL', KEYS[2], sid)
return 1
