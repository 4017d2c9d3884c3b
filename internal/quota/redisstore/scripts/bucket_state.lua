-- Prepended to bucket_lease.lua and bucket_return.lua: a token bucket's
-- state, advanced to now, with the tokens out on hybrid leases.
--
-- The bucket is a hash: used = tokens in use (a fraction while it
-- refills), ts = when used was computed (µs), iv = µs per token at that
-- time. Counting used tokens (small numbers) rather than an instant keeps
-- full double precision: no drift. Leases outstanding are kept by expiry,
-- not by replica: a field "x<ms>" per expiry instant (Redis time in ms, a
-- multiple of the lease grain, so a handful of fields whatever the number
-- of replicas) holds the tokens granted in unexpired leases ending then.
-- out is their sum. b, when set, is the end of the key's penalty box
-- (block_for, µs): until then bucket_lease.lua grants nothing but charges.
--
-- k and g name what this Redis remembers of the key's leases: k is the
-- key's incarnation (Redis TIME in µs when its first lease was counted
-- out; a key lost and created again gets another), g the leases counted
-- out since (one more per lease). A replica keeps the pair its lease was
-- granted with and passes it when it retires the lease: a key whose k
-- differs, or whose g is lower, has lost that grant (a restart without
-- persistence, FLUSHALL, an eviction, a failover to a replica that missed
-- the write, an older RDB): that Redis never debited the lease, so its
-- unspent tokens are not given back, and what the replica spent from it
-- is charged instead (bucket_retire). Replication applies a master's
-- writes in order, so a state that holds the grant holds every g below.
--
-- The bound (why leases may live long): let U be the tokens replicas hold
-- unspent and may still spend; U <= out, because a replica stops spending
-- a lease before Redis's expiry of it (it measures the lease's life from
-- when it sent the call) and retires it from out only once it stopped.
-- Refill never lifts used below out, so level + out <= capacity, where
-- level = capacity - used: X = level + U is at most the capacity at every
-- instant. A grant moves tokens from level to U, a return from U to level,
-- an expiry drops unspent ones (X falls), and only refill raises X, by
-- rate × T in any interval T. Every admission spends one unit of X, so
-- over any interval of length T the replicas together admit at most
-- capacity + rate × T: one exact bucket's promise, for any lease life.
-- Charges (charge: always, bucket_lease.lua) are no admissions of this
-- count: they are spent at once, never leased, and only lower the level,
-- below empty into debt, which refill must pay before avail (never below
-- 0) lets a lease hand anything out again; the bound holds as it is.
--
-- Advancing replays the expiries in order: between two of them the
-- bucket refills down to the out in force then, so an expiry never lets
-- the level jump up by what refill could not add while the lease was out.

-- bucket_load reads key's bucket and advances it to now: the expired
-- lease fields are deleted. iv is the refill interval to use when the
-- hash has none (nil: a bucket with no state is returned as nil).
local function bucket_load(key, iv, now)
  local raw = redis.call('HGETALL', key)
  local b = {used = 0, ts = now, iv = iv, out = 0, last = 0, block = 0, k = 0, g = 0}
  local fresh = true
  local leases = {}
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    if f == 'used' then
      b.used = tonumber(v) or 0
      fresh = false
    elseif f == 'ts' then
      b.ts = tonumber(v) or now
    elseif f == 'iv' then
      b.iv = tonumber(v) or iv
    elseif f == 'b' then
      b.block = tonumber(v) or 0
    elseif f == 'k' then
      b.k = tonumber(v) or 0
    elseif f == 'g' then
      b.g = tonumber(v) or 0
    elseif string.byte(f, 1) == 120 then -- 'x'
      local at, n = tonumber(string.sub(f, 2)), tonumber(v) or 0
      if at and n > 0 then
        leases[#leases + 1] = {at * 1000, n, f}
        b.out = b.out + n
      end
    end
  end
  if fresh and #leases == 0 and not iv then return nil end
  if not b.iv then return nil end
  table.sort(leases, function(p, q) return p[1] < q[1] end)
  local function refill(to)
    if to > b.ts then
      if b.used > b.out then
        b.used = math.max(b.used - (to - b.ts) / b.iv, b.out)
      end
      b.ts = to
    end
  end
  for _, l in ipairs(leases) do
    if l[1] <= now then
      refill(l[1])
      b.out = b.out - l[2]
      redis.call('HDEL', key, l[3])
      -- The replay must be written: a later call that found the field
      -- gone would refill from ts under the lower out.
      b.dirty = true
    else
      b.last = math.max(b.last, l[1])
    end
  end
  refill(now)
  if b.out < 0 then b.out = 0 end
  return b
end

-- bucket_retire ends one lease: its tokens (granted) leave out, and what
-- was not spent of them (unspent) goes back to the bucket. A lease whose
-- field is gone (expired, or the key lost) only gives its unspent back,
-- never lifting the level above capacity − out. When the replica names
-- the lease's key state (k, g: the lease is live on the replica, so it
-- is live here unless this Redis lost it) and this Redis does not hold
-- it, the lease is forgotten: nothing is given back or taken off out (the
-- fields left are other grants'), and owed, what the replica spent from
-- it that this Redis never counted, is charged. Returns true then.
local function bucket_retire(key, b, at, granted, unspent, k, g, owed)
  if at and at > 0 and granted > 0 and k and k > 0 and (b.k ~= k or b.g < (g or 0)) then
    if owed and owed > 0 then
      b.used = b.used + owed
      b.dirty = true
    end
    return true
  end
  if at and at > 0 and granted > 0 then
    local f = 'x' .. string.format('%d', at)
    local cur = tonumber(redis.call('HGET', key, f))
    if cur then
      local n = math.min(cur, granted)
      b.out = b.out - n
      if cur - n > 0 then
        redis.call('HSET', key, f, string.format('%d', cur - n))
      else
        redis.call('HDEL', key, f)
      end
      b.dirty = true
    end
  end
  if unspent > 0 then
    b.used = math.max(b.used - unspent, b.out, 0)
    b.dirty = true
  end
  return false
end

-- bucket_owed is what to charge for a lease this Redis forgot: all the
-- replica spent of it (owed), or, when the epoch key no longer holds the
-- epoch the replica last confirmed (the whole store was lost after that
-- confirmation, so what was spent before it was counted in the state
-- lost, as redis mode's admissions were), what was spent since (since).
-- An eviction or a failover keeps the epoch: all of it is charged, as the
-- key may have been lost at any time since the lease was granted.
local function bucket_owed(epoch_key, owed, since, epoch)
  owed = tonumber(owed) or 0
  if epoch_key and epoch and epoch ~= '' and redis.call('GET', epoch_key) ~= epoch then
    return math.min(tonumber(since) or 0, owed)
  end
  return owed
end

-- bucket_count_lease records a lease counted out: the key's incarnation
-- (set at its first lease) and one more generation. Returns both.
local function bucket_count_lease(key, b)
  if b.k == 0 then
    local t = redis.call('TIME')
    b.k = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  b.g = b.g + 1
  redis.call('HSET', key, 'k', string.format('%d', b.k), 'g', string.format('%d', b.g))
  return b.k, b.g
end

-- bucket_save writes b back, or deletes the bucket when it is full with
-- nothing out. keep is the least TTL in ms (injected test time).
local function bucket_save(key, b, now, keep)
  local blocked = b.block > now
  if b.used <= 1e-9 and b.out <= 0 and not blocked then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'used', string.format('%.17g', b.used), 'ts', string.format('%d', b.ts), 'iv', string.format('%.17g', b.iv))
  if blocked then
    redis.call('HSET', key, 'b', string.format('%d', b.block))
    -- The key must outlive its block, or the block would end early.
    keep = math.max(keep, math.ceil((b.block - now) / 1000) + 1)
  end
  -- Once every lease has expired and the bucket refilled, it is the same
  -- as no bucket: let it go then, and not before.
  local ttl = math.ceil(b.used * b.iv / 1000) + 1
  if b.last > now then ttl = ttl + math.ceil((b.last - now) / 1000) end
  redis.call('PEXPIRE', key, math.max(ttl, keep))
end
