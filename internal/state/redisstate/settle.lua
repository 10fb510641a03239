#!lua flags=allow-cross-slot-keys
-- Settle a strict lease: give back (or take) each amount and free its KV,
-- only while the store holds the lease: a repeated settle, one for a
-- commit that never landed, or one after the lease's TTL changes nothing.
-- KEYS: one key, which routes the call to the node that owns it.
-- ARGV: n, the bucket hashes, the KV holds hash and expiry zset, then per
-- bucket: rate, burst, amount; then the lease. An empty lease (and KV
-- keys) settles the buckets alone, unchecked: the part of a lease on
-- another node than its KV's, sent once that node has settled the lease.
-- Returns 1 if settled, 0 if the store held no such lease.
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local n = tonumber(ARGV[1])
local hk, zk, lease = ARGV[n + 2], ARGV[n + 3], ARGV[4 + n * 4]
local held
if lease ~= '' then
  held = redis.call('HGET', hk, lease)
  local exp = redis.call('ZSCORE', zk, lease)
  if not held or not exp or tonumber(exp) <= now then return 0 end
end
for i = 1, n do
  local b = 4 + n + (i - 1) * 3
  local rate, burst, amount = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local h = redis.call('HMGET', ARGV[1 + i], 'l', 't')
  local level, ts = tonumber(h[1]), tonumber(h[2])
  -- A bucket that expired is full: a refund changes nothing, but a
  -- negative one (the request cost more than it took) is still charged.
  if level or amount < 0 then
    if not level then level, ts = burst, now end
    level = math.min(burst, level + rate * math.max(now - ts, 0) / 1e6)
    level = math.max(math.min(burst, level + amount), -burst)
    redis.call('HSET', ARGV[1 + i], 'l', num(level), 't', num(now))
    local idle = 60000
    if rate > 0 then idle = idle + math.ceil(1000 * burst / rate) end
    redis.call('PEXPIRE', ARGV[1 + i], idle)
  end
end
if lease ~= '' then
  redis.call('HINCRBY', hk, '_sum', int(-tonumber(held)))
  redis.call('HDEL', hk, lease)
  redis.call('ZREM', zk, lease)
end
return 1
