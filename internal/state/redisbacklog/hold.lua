-- Refresh this consumer's holds: one page of its pending entries, claimed
-- again (JUSTID: idle time back to 0) so that no other replica reclaims them.
-- KEYS[1] a shard's stream. ARGV[1] the group, ARGV[2] this consumer,
-- ARGV[3] the first id ('-', or '(' and the last id of the page before),
-- ARGV[4] the page size.
-- Returns {the page's last id, its size}; size 0 when done.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'', 0}
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], '+', ARGV[4], ARGV[2])
if #p == 0 then
  return {'', 0}
end
local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
for _, e in ipairs(p) do
  args[#args + 1] = e[1]
end
args[#args + 1] = 'JUSTID'
redis.call(unpack(args))
return {p[#p][1], #p}
