-- Prepended to every script (see newScript): the decision instant in
-- microseconds. Tests pass a time in the script's argument; otherwise it is
-- the Redis server's clock, never a replica's.
local function now_us(arg)
  local injected = tonumber(arg)
  if injected then return injected end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

