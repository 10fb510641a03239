#!lua flags=allow-cross-slot-keys
-- One strict decision: take every amount or none (see package state).
-- KEYS: one key, which routes the call to the node that owns it.
-- ARGV: ntakes, the bucket hashes, the KV holds hash and expiry zset, then
-- per take: rate, burst, amount, min; then lease, kv limit, kv bytes,
-- ttl_us, then the committing replica, alive_us and the KV liveness hash
-- (replica: until, in µs). An empty lease (and KV keys) takes the buckets
-- alone: the part of a decision on another node than its KV's.
-- A positive alive_us renews the replica's liveness on the KV; a replica
-- whose liveness has lapsed loses all its holds (leases "replica/…").
-- Returns {1, level after the take per bucket...} admitted, or {0, refused
-- index (ntakes: KV), retry_us}.
-- A lease already held was committed by an earlier call: {1}, nothing taken.

-- Numbers written to Redis go through num (the default conversion keeps
-- only 14 digits); HINCRBY takes integers, through int ("-0" is refused).
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local n = tonumber(ARGV[1])
local hk, zk = ARGV[n + 2], ARGV[n + 3]
local b = 4 + n * 5
local lease, limit, bytes, ttl = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
local replica, alive, ak = ARGV[b + 4], tonumber(ARGV[b + 5]), ARGV[b + 6]
if lease ~= '' and alive > 0 then
  redis.call('HSET', ak, replica, num(now + alive))
  redis.call('PEXPIRE', ak, math.ceil(alive / 1000) + 60000)
end
if lease ~= '' and redis.call('HEXISTS', hk, lease) == 1 then return {1} end
local levels = {}
for i = 1, n do
  local a = 4 + n + (i - 1) * 4
  local rate, burst, amount, floor = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local h = redis.call('HMGET', ARGV[1 + i], 'l', 't')
  local level, ts = tonumber(h[1]), tonumber(h[2])
  if not level then level, ts = burst, now end
  level = math.min(burst, level + rate * math.max(now - ts, 0) / 1e6)
  if level - amount < floor then
    local retry = 0
    if rate > 0 then retry = math.ceil((amount + floor - level) / rate * 1e6) end
    return {0, i - 1, retry}
  end
  levels[i] = level - amount
end
if lease ~= '' then
  -- The holds of a replica silent past its liveness are freed first...
  local al = redis.call('HGETALL', ak)
  for i = 1, #al, 2 do
    if tonumber(al[i + 1]) <= now then
      local prefix = al[i] .. '/'
      for _, l in ipairs(redis.call('HKEYS', hk)) do
        if string.sub(l, 1, #prefix) == prefix then
          redis.call('HINCRBY', hk, '_sum', int(-tonumber(redis.call('HGET', hk, l))))
          redis.call('HDEL', hk, l)
          redis.call('ZREM', zk, l)
        end
      end
      redis.call('HDEL', ak, al[i])
    end
  end
  -- ...and holds past their lease TTL (a vanished replica's).
  for _, l in ipairs(redis.call('ZRANGEBYSCORE', zk, '-inf', num(now))) do
    local held = redis.call('HGET', hk, l)
    if held then
      redis.call('HINCRBY', hk, '_sum', int(-tonumber(held)))
      redis.call('HDEL', hk, l)
    end
  end
  redis.call('ZREMRANGEBYSCORE', zk, '-inf', num(now))
  local sum = tonumber(redis.call('HGET', hk, '_sum') or '0')
  if sum + bytes > limit then return {0, n, 0} end
end
for i = 1, n do
  redis.call('HSET', ARGV[1 + i], 'l', num(levels[i]), 't', num(now))
  local a = 4 + n + (i - 1) * 4
  local rate, burst = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local idle = 60000
  if rate > 0 then idle = idle + math.ceil(1000 * burst / rate) end
  redis.call('PEXPIRE', ARGV[1 + i], idle)
end
if lease ~= '' then
  redis.call('HSET', hk, lease, int(bytes))
  redis.call('HINCRBY', hk, '_sum', int(bytes))
  redis.call('ZADD', zk, num(now + ttl), lease)
  local keep = math.ceil(ttl / 1000) + 60000
  redis.call('PEXPIRE', hk, keep)
  redis.call('PEXPIRE', zk, keep)
end
local out = {1}
for i = 1, n do out[i + 1] = math.floor(levels[i]) end
return out
