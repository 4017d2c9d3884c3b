-- Take a request's cost from a sliding log, atomically, all or none:
-- exact, one sorted-set member per admitted unit of the last window.
--
-- KEYS[1]  the log, a sorted set: score = instant of an admitted request
--          (µs), member = a unique id from the caller.
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  this request's member, unique across replicas (a request of n
--          units adds members ARGV[3], ARGV[3].2, ..., ARGV[3].n)
-- ARGV[4]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[5]  units (the cost); 0 decides as for one and logs nothing
--
-- Returns {allowed, remaining, retry, reset, delay}: 1 or 0; units left;
-- µs until the oldest entry that keeps the log full leaves the window when
-- rejected (else 0); µs until the newest entry leaves it; 0.
--
-- Cost: ZREMRANGEBYSCORE O(log N + removed), ZCARD O(1), ZADD O(log N);
-- memory one member per admitted request in the window.
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding, and a test may run longer than a TTL computed from
-- injected instants: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[4]) then keep = 60000 end
local now = now_us(ARGV[4])
local units = tonumber(ARGV[5]) or 1
local spend = math.max(units, 1)

-- An entry at exactly now - w has left the window (now - w, now].
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - w))
local n = redis.call('ZCARD', KEYS[1])
if n + spend <= limit then
  if units == 0 then
    local reset = 0
    if n > 0 then
      local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
      reset = tonumber(last[2]) + w - now
    end
    return {1, limit - n, 0, reset, 0}
  end
  local at = string.format('%d', now)
  redis.call('ZADD', KEYS[1], at, ARGV[3])
  for i = 2, units do
    redis.call('ZADD', KEYS[1], at, ARGV[3] .. '.' .. i)
  end
  -- The whole log has left the window one window after its newest entry.
  redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(w / 1000) + 1, keep))
  return {1, limit - n - units, 0, w, 0}
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local reset = tonumber(last[2]) + w - now
if spend > limit then
  return {0, 0, reset, reset, 0} -- never fits; say when the log is empty
end
-- Full for these units. The oldest k entries must leave, the last of them
-- at rank k - 1; after a reload lowered the limit n may exceed it, and
-- then the oldest of the newest `limit` leaves first, at rank n - limit.
local k = n + spend - limit
local first = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
return {0, 0, tonumber(first[2]) + w - now, reset, 0}
