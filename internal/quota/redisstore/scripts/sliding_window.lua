-- Take a request's cost from a sliding window counter (Cloudflare's
-- weighted two windows), atomically, all or none; or, in hybrid mode,
-- lease a count of the current window. The math, and why the wait is
-- exact, is in internal/quota/windows.go.
--
-- A lease is counted in the current window's count when granted and dies
-- with the window. Within a window the previous window's weight only
-- falls, so an estimate that held the lease within the limit when it was
-- granted stays within it until the window ends: every unit spent from
-- the lease is admitted as an exact take at that instant would be.
--
-- KEYS[1]  the counter, a hash: w = start of the window counted (µs, epoch
--          aligned), p = the previous window's count, c = this window's.
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  units wanted (the cost); 0 decides as for one and counts nothing
-- ARGV[5]  units needed at least; empty: the cost (at least one)
-- ARGV[6]  replicas sharing the window, for a lease: the take is at most
--          half of what fits over them (never below need); empty or 0: exact
-- ARGV[7], ARGV[8]  the lease given back: its window's start (µs) and its
--          unspent units (this window's or the previous one's); empty: none
-- ARGV[9]  1: a charge (charge: always): the units are counted whatever
--          the estimate, which may pass the limit; the debt weighs on the
--          next window as any count does. Empty: a take.
-- ARGV[10] block_for in µs, the penalty box: a take or question denied
--          here puts the key in its box until now + ARGV[10] (the field
--          b); until then every take and question is denied with the
--          block's end as both waits, the counts left as they are (charges
--          are still counted: they record units already served). Denials
--          during a block do not extend it; a block already set is
--          honoured whatever ARGV[10] says. Empty: none. A hybrid lease
--          granted before the block may still be spent by its replica: at
--          most what it leased, about the request's cost near the limit.
-- ARGV[11], ARGV[12]  units held out of this window's room, and the start
--          (µs) of the window they are held in (in another: nothing is
--          held): a replica that decided this window by its fallback
--          while Redis was out of its reach sets aside its own fallback
--          admissions and what the other replicas' may have been, which
--          Redis never counted. Empty: none.
--
-- Returns {allowed, remaining, retry, reset, delay, granted, ws, left}: 1
-- or 0; units that would still fit now; µs until one fits when rejected
-- (else 0); µs until the estimate is back to zero; 0; units taken; the
-- window's start (µs), the lease's name; µs until it ends, the lease's life.
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding, and a test may run longer than a TTL computed from
-- injected instants: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[3]) then keep = 60000 end
local now = now_us(ARGV[3])
local n = tonumber(ARGV[4]) or 1
local spend = tonumber(ARGV[5]) or math.max(n, 1)
local peers = tonumber(ARGV[6]) or 0
local ws = now - (now % w)
local e = now - ws

local st = redis.call('HMGET', KEYS[1], 'w', 'p', 'c', 'b')
local sw = tonumber(st[1])
local until_ = tonumber(st[4]) or 0
local block = tonumber(ARGV[10]) or 0
local p, c = 0, 0
if sw == ws then
  p, c = tonumber(st[2]) or 0, tonumber(st[3]) or 0
elseif sw == ws - w then
  p = tonumber(st[3]) or 0 -- one window on: this window's count is now the previous one
end
-- The key lives while this window's count weighs on the next, and while
-- its block lasts.
local function expire()
  local ms = math.ceil((2 * w - e) / 1000) + 1
  if until_ > now then ms = math.max(ms, math.ceil((until_ - now) / 1000) + 1) end
  redis.call('PEXPIRE', KEYS[1], math.max(ms, keep))
end
local function save()
  redis.call('HSET', KEYS[1], 'w', string.format('%d', ws), 'p', string.format('%d', p), 'c', string.format('%d', c))
  if until_ > now then redis.call('HSET', KEYS[1], 'b', string.format('%d', until_)) end
  expire()
end
local reserve = 0
if tonumber(ARGV[12]) == ws then reserve = tonumber(ARGV[11]) or 0 end
local back = tonumber(ARGV[8]) or 0
local dirty = false
if back > 0 and tonumber(ARGV[7]) == ws and c > 0 then
  c = math.max(c - back, 0)
  dirty = true
elseif back > 0 and tonumber(ARGV[7]) == ws - w and p > 0 then
  -- A lease of the window just ended, given back at its first renewal in
  -- this one: its unspent units were never admitted, so they leave the
  -- previous window's count rather than weigh on this window.
  p = math.max(p - back, 0)
  dirty = true
end

-- estimate + n <= limit, multiplied through by w to stay in integers:
-- p*(w-e)/w + c + n <= limit.
local charge = ARGV[9] == '1' and n > 0
local fits = p * (w - e) + (c + reserve + spend) * w <= limit * w
if not charge and (until_ > now or (not fits and block > 0)) then
  if until_ <= now then
    until_ = now + block
    dirty = true
  end
  if dirty then save() end
  return {0, 0, until_ - now, until_ - now, 0, 0, ws, w - e}
end
if charge or fits then
  local reset = 2 * w - e
  local granted = n
  if peers > 0 and not charge then
    local room = math.floor((limit * w - p * (w - e)) / w) - c - reserve
    granted = math.min(n, math.max(spend, math.floor(room / (2 * peers))))
  end
  if granted > 0 then
    c = c + granted
    dirty = true
  elseif c == 0 then
    reset = 0
    if p > 0 then reset = w - e end
  end
  if dirty then save() end
  return {1, math.max(math.floor((limit * w - p * (w - e) - (c + reserve) * w) / w), 0), 0, reset, 0, granted, ws, w - e}
end
if dirty then save() end

-- Rejected: solve estimate(t) + n <= limit for the first t >= e.
local t
if spend > limit then
  t = 2 * w -- never fits: until both windows' counts are gone
elseif c + spend <= limit then
  t = math.ceil(w * (p - (limit - c - spend)) / p)
else
  t = w + math.ceil(w * (c - (limit - spend)) / c)
end
local reset = 0
if c > 0 then reset = 2 * w - e elseif p > 0 then reset = w - e end
return {0, 0, t - e, reset, 0, 0, ws, w - e}
