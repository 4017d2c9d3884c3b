-- Prepended to the fixed-window scripts (fixed_window.lua and
-- calendar_window.lua): the count of one window, taken atomically, all or
-- none, decided before counting so a rejected request counts nothing.
--
-- key is a hash: w = start of the window counted (µs), c = units admitted
-- in it. Keeping w beside the count means a stale count is never read as
-- the current one, whether or not the key has expired yet (and with
-- injected test time, when Redis' own expiry clock is elsewhere). The
-- window is [ws, we); n units (0 decides as for one and counts nothing);
-- keep is the least TTL in ms.
--
-- Returns {allowed, remaining, retry, reset, delay}: 1 or 0; units left in
-- this window; µs until the window ends when rejected (else 0); µs until
-- the window ends; 0 (no algorithm but the leaky bucket holds requests).
local function window_take(key, ws, we, now, n, limit, keep)
  local left = we - now
  local st = redis.call('HMGET', key, 'w', 'c')
  local c = 0
  if tonumber(st[1]) == ws then c = tonumber(st[2]) or 0 end
  if c + math.max(n, 1) <= limit then
    if n > 0 then
      c = c + n
      redis.call('HSET', key, 'w', string.format('%d', ws), 'c', string.format('%d', c))
      -- The count means nothing once its window is over.
      redis.call('PEXPIRE', key, math.max(math.ceil(left / 1000) + 1, keep))
    end
    return {1, limit - c, 0, left, 0}
  end
  return {0, 0, left, left, 0}
end

