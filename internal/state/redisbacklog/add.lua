-- Add a pending ticket: its stream entry, held by this consumer, and its hash.
-- KEYS[1] the ticket's hash, KEYS[2] its shard's stream (one hash slot).
-- ARGV[1] the record as JSON, ARGV[2] the ticket id, ARGV[3] the group,
-- ARGV[4] this consumer.
-- Returns the entry's stream id: the new one, or the one the ticket has
-- already (a retried Add writes nothing).
local sid = redis.call('HGET', KEYS[1], 'sid')
if sid then
  return sid
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- A Redis that lost its data: the stream and its group come back together.
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[3], '0', 'MKSTREAM')
end
sid = redis.call('XADD', KEYS[2], '*', 'id', ARGV[2])
-- Into this consumer's pending list without a read: nobody reads '>'.
redis.call('XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, sid, 'FORCE', 'JUSTID')
redis.call('HSET', KEYS[1], 'rec', ARGV[1], 'sid', sid, 'state', '1')
return sid
