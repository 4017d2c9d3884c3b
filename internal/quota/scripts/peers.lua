-- Record this replica's heartbeat and count the replicas heard recently.
--
-- KEYS[1]  a sorted set: member = replica id, score = last heartbeat (ms)
-- ARGV[1]  this replica's id
-- ARGV[2]  peer ttl in ms: replicas silent for longer are gone
-- ARGV[3]  now in ms for tests; empty: Redis TIME
--
-- Returns the number of live replicas, this one included.
local ttl = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])
