#!lua flags=allow-cross-slot-keys
-- One replica's batched report; returns its grants (see package state).
-- KEYS: one key, which routes the call to the node that owns it.
-- ARGV: replica, stale_us, nbuckets, N (replicas), rejoin_us, ngauges,
--   nengines, the bucket hashes, the gauge hashes, the gauge hashes of the
--   engine readings (any slots the node owns), then per bucket rate, burst,
--   cum, unacked, demand, epoch, age_us, resume (0|1), held, span_us; then
--   per gauge: limit, held, share, ttl_us; then per engine entry: published
--   (0|1), queue, running, kv usage, age_us.
-- Bucket hash fields: l level, t last refill (us), born (us), rb last rebuild
--   from the replicas' levels (us); per replica r: c:r "epoch:cumulative",
--   d:r demand, s:r last seen (us), h:r the rebuild r's level went into and
--   v:r that level.
-- Gauge hash fields: h:r held, w:r share, u:r valid until (us); the domain's
--   newest engine reading: eq queue, er running, ek kv usage, ea when it was
--   made (us), eb the replica that made it (never answered its own).
-- Returns per bucket {rate granted in thousandths, level share}, per gauge
-- the replica's limit, or {limit, reading} where its domain has an engine
-- reading, per engine entry the domain's reading or 0 where none is held;
-- a reading is {queue, running, kv usage, age_us, stamp (its ea)}: the
-- numbers as written, the age and stamp integers (a reply turns a Lua
-- number into an integer);
-- false (nil) for a key the node could not serve (its slot is elsewhere,
-- or migrating): the caller sends it again alone.

-- Numbers written to Redis go through num: the default conversion keeps
-- only 14 digits, too few for microsecond times and 52-bit counters.
local function num(x) return string.format('%.17g', x) end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local rid, stale, nb, N = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), math.max(tonumber(ARGV[4]), 1)
local rejoin, ng, ne = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local key0 = 7
-- A silent replica leaves the shares after stale, its counter only after
-- forget: a replica back from a long breaker must still find it.
local forget = math.max(100 * stale, 60000000)
local M = 4503599627370496 -- 2^52, admission.CumModulus
local out = {}
local a = key0 + nb + ng + ne + 1

local function fields(key)
  local f, kv = {}, redis.call('HGETALL', key)
  for i = 1, #kv, 2 do f[kv[i]] = kv[i + 1] end
  return f
end

-- Max-min fair division of rate over demands (memstate.Waterfill).
local function waterfill(rate, ids, dem)
  local n = #ids
  local least = rate / (20 * n)
  local pool = rate - least * n
  table.sort(ids, function(x, y) return dem[x] < dem[y] end)
  local g = {}
  for i, r in ipairs(ids) do
    local give = math.min(math.max(dem[r] - least, 0), pool / (n - i + 1))
    g[r] = least + give
    pool = pool - give
  end
  for _, r in ipairs(ids) do g[r] = g[r] + pool / n end
  return g
end

local function bucket(b, key)
  local rate, burst = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
  local cumArg, unacked, demArg = ARGV[b + 2], tonumber(ARGV[b + 3]), ARGV[b + 4]
  local epoch, age = ARGV[b + 5], tonumber(ARGV[b + 6])
  local resume, held, span = ARGV[b + 7] == '1', tonumber(ARGV[b + 8]), tonumber(ARGV[b + 9])
  local f = fields(key)
  local level, ts = tonumber(f.l), tonumber(f.t)
  local rb = tonumber(f.rb)
  -- Back from an outage (see admission.BucketReport.Resume): the replicas'
  -- own levels, which refilled at their grants while the store could not,
  -- are the truth; the store's refill, capped at the burst, is not.
  local rebuilt = false
  if resume and (not level or now - ts > stale) then
    level, ts, rebuilt = held, now, true
    rb = now
    redis.call('HSET', key, 'rb', num(rb))
  elseif resume and level and rb and now - rb <= rejoin and now - span < rb then
    -- Back from the same outage: its level joins the others'. If it already
    -- brought one to this rebuild (its answer was lost, or the report ran
    -- late, after a pause, with a level from before the outage), this one,
    -- newer, replaces it.
    local before = 0
    if f['h:' .. rid] == f.rb then before = tonumber(f['v:' .. rid]) or 0 end
    level = math.min(math.max(burst, level), level + rate * math.max(now - ts, 0) / 1e6) + held - before
    ts, rebuilt = now, true
  end
  if rebuilt then
    level = math.min(level, burst)
    redis.call('HSET', key, 'h:' .. rid, num(rb), 'v:' .. rid, num(held))
  elseif not level then
    -- Full since the replica started it, less what it spent (below).
    level, ts, f.born = burst + rate * age / 1e6, now, num(now)
    redis.call('HSET', key, 'born', f.born)
  end
  if not rebuilt then
    level = math.min(math.max(burst, level), level + rate * math.max(now - ts, 0) / 1e6)
    -- Charge the difference from the last cumulative of the same epoch, so a
    -- repeated report counts once; with none (a new epoch, or forgotten) the
    -- unacknowledged part.
    local delta = unacked
    local prev = f['c:' .. rid]
    if prev then
      local pe, pc = string.match(prev, '^(%d+):(%d+)$')
      if pe == epoch then
        delta = (tonumber(cumArg) - tonumber(pc)) % M
        if delta > M / 2 then delta = delta - M end
      end
    end
    level = math.min(level - delta, burst)
  end
  f['d:' .. rid], f['s:' .. rid] = demArg, num(now)
  local ids, dem = {}, {}
  for field, v in pairs(f) do
    if string.sub(field, 1, 2) == 's:' then
      local r = string.sub(field, 3)
      local quiet = now - tonumber(v)
      if r ~= rid and quiet > forget then
        redis.call('HDEL', key, 'c:' .. r, 'd:' .. r, 's:' .. r, 'h:' .. r, 'v:' .. r)
      elseif r == rid or quiet <= stale then
        ids[#ids + 1] = r
        dem[r] = tonumber(f['d:' .. r])
      end
    end
  end
  local g = waterfill(rate, ids, dem)[rid]
  local share = level / #ids
  if rate > 0 then share = level * g / rate end
  -- Replicas yet to report a new bucket hold their 1/N starting slices.
  if now - tonumber(f.born or 0) <= stale and #ids < N then share = share * #ids / N end
  redis.call('HSET', key, 'l', num(level), 't', num(now), 'c:' .. rid, epoch .. ':' .. cumArg,
    'd:' .. rid, demArg, 's:' .. rid, num(now))
  -- Idle past a refill and a few reports, the bucket would be full again:
  -- let it go.
  local ttl = 10 * stale / 1000
  if rate > 0 then ttl = ttl + 1000 * burst / rate end
  redis.call('PEXPIRE', key, math.ceil(ttl))
  return {math.floor(g * 1000), math.floor(share)}
end

-- reading answers a domain's engine reading to the asking replica: 0 where
-- there is none to answer (none held, its own, or one from the future).
local function reading(q, r, kv, at, by)
  at = tonumber(at or '')
  if not at or by == rid or at > now then return 0 end
  return {q, r, kv, now - at, at}
end

local function gauge(b, key)
  local limit, held, share, ttl = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  redis.call('HSET', key, 'h:' .. rid, ARGV[b + 1], 'w:' .. rid, ARGV[b + 2], 'u:' .. rid, num(now + ttl))
  local f = fields(key)
  local total, shares, n = 0, 0, 0
  for field, v in pairs(f) do
    if string.sub(field, 1, 2) == 'u:' then
      local r = string.sub(field, 3)
      if r ~= rid and tonumber(v) <= now then -- a vanished replica's leases have expired
        redis.call('HDEL', key, 'h:' .. r, 'w:' .. r, 'u:' .. r)
      else
        total = total + tonumber(f['h:' .. r])
        shares = shares + tonumber(f['w:' .. r])
        n = n + 1
      end
    end
  end
  local free = math.max(limit - total, 0)
  -- Each replica weighs at least 1/20 of an equal share (as in waterfill):
  -- one that took nothing last round (demand 0) must still get some of the
  -- free part, or it could never take anything again.
  local mine = free / n
  if shares > 0 then
    local least = shares / (20 * n)
    mine = free * (share + least) / (shares + n * least)
  end
  redis.call('PEXPIRE', key, math.ceil(ttl / 1000) + 1000)
  local limit = math.floor(held + mine)
  local r = reading(f['eq'], f['er'], f['ek'], f['ea'], f['eb'])
  if r == 0 then return limit end
  return {limit, r}
end

-- A published reading older than the one held is dropped; one held from
-- the future (written on a master whose clock ran ahead of this one's,
-- before a failover) is replaced, and never answered. The hash lives
-- at least a few seconds after one: a reading that old is stale to every
-- replica.
local function engine(b, key)
  if ARGV[b] == '1' then
    local at = now - tonumber(ARGV[b + 4])
    local held = tonumber(redis.call('HGET', key, 'ea') or '')
    if not held or held < at or held > now then
      redis.call('HSET', key, 'eq', ARGV[b + 1], 'er', ARGV[b + 2], 'ek', ARGV[b + 3], 'ea', num(at), 'eb', rid)
      if redis.call('PTTL', key) < 5000 then redis.call('PEXPIRE', key, 5000) end
    end
  end
  local e = redis.call('HMGET', key, 'eq', 'er', 'ek', 'ea', 'eb')
  return reading(e[1], e[2], e[3], e[4], e[5])
end

-- A key of a slot the node does not serve fails at its first call, before
-- anything of it is written: pcall keeps the others' answers.
for i = 1, nb + ng + ne do
  local ok, res
  if i <= nb then
    ok, res = pcall(bucket, a + 10 * (i - 1), ARGV[key0 + i])
  elseif i <= nb + ng then
    ok, res = pcall(gauge, a + 10 * nb + 4 * (i - nb - 1), ARGV[key0 + i])
  else
    ok, res = pcall(engine, a + 10 * nb + 4 * ng + 5 * (i - nb - ng - 1), ARGV[key0 + i])
  end
  if ok then out[i] = res else out[i] = false end
end
return out
