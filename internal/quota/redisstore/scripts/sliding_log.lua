-- Take one unit from a sliding log, atomically: exact, one sorted-set
-- member per admitted request of the last window.
--
-- KEYS[1]  the log, a sorted set: score = instant of an admitted request
--          (µs), member = a unique id from the caller.
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  this request's member, unique across replicas
-- ARGV[4]  now in µs for tests; empty: Redis TIME, never a replica's clock
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

-- An entry at exactly now - w has left the window (now - w, now].
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - w))
local n = redis.call('ZCARD', KEYS[1])
if n < limit then
  redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[3])
  -- The whole log has left the window one window after its newest entry.
  redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(w / 1000) + 1, keep))
  return {1, limit - n - 1, 0, w, 0}
end
-- Full. After a reload lowered the limit n may exceed it: the entry that
-- must leave first is the oldest of the newest `limit`, at rank n - limit.
local first = redis.call('ZRANGE', KEYS[1], n - limit, n - limit, 'WITHSCORES')
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
return {0, 0, tonumber(first[2]) + w - now, tonumber(last[2]) + w - now, 0}
