-- Reclaim one page of a shard's pending list: the entries of other
-- consumers idle for at least the reclaim idle (their replica stopped
-- refreshing its holds) become this consumer's. This consumer's own idle
-- entries (its refresh ran late) are refreshed, not returned: it holds
-- them already. Unlike XAUTOCLAIM, which cannot tell them apart.
-- KEYS[1] a shard's stream. ARGV[1] the group, ARGV[2] this consumer,
-- ARGV[3] the reclaim idle in ms, ARGV[4] the first id ('-', or '(' and
-- the last id of the page before), ARGV[5] the page size.
-- Returns {the page's last id, its size, the entries reclaimed}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'', 0, {}}
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[4], '+', ARGV[5])
if #p == 0 then
  return {'', 0, {}}
end
local idle = tonumber(ARGV[3])
local mine = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
local theirs = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3]}
for _, e in ipairs(p) do
  if e[3] >= idle then
    if e[2] == ARGV[2] then
      mine[#mine + 1] = e[1]
    else
      theirs[#theirs + 1] = e[1]
    end
  end
end
if #mine > 5 then
  mine[#mine + 1] = 'JUSTID'
  redis.call(unpack(mine))
end
local got = {}
if #theirs > 5 then
  got = redis.call(unpack(theirs))
end
return {p[#p][1], #p, got}
