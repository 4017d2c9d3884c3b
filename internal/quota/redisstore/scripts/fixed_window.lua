-- Take a request's cost from a fixed window counter, atomically, all or
-- none: INCRBY with TTL semantics (window_take.lua); or, in hybrid mode,
-- lease a count of the current window.
--
-- KEYS[1]  the counter (window_take.lua), its windows epoch aligned
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  units wanted (the cost); 0 decides as for one and counts nothing
-- ARGV[5]  units needed at least; empty: the cost (at least one)
-- ARGV[6]  replicas sharing the window, for a lease; empty or 0: exact
-- ARGV[7], ARGV[8]  the lease given back: its window's start (µs) and its
--          unspent units; empty: none
-- ARGV[9]  1: a charge (charge: always, window_take.lua); empty: a take
-- ARGV[10] block_for in µs, the penalty box (window_take.lua); empty: none
-- ARGV[11], ARGV[12]  units held out of the room (window_take.lua's
--          reserve) and the start (µs) of the window they are held in:
--          in another window, nothing is held; empty: none
--
-- Returns window_take's {allowed, remaining, retry, reset, delay, granted, ws, left}.
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding, and a test may run longer than a TTL computed from
-- injected instants: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[3]) then keep = 60000 end
local now = now_us(ARGV[3])
local n = tonumber(ARGV[4]) or 1
local need = tonumber(ARGV[5]) or math.max(n, 1)
local ws = now - (now % w)
local reserve = 0
if tonumber(ARGV[12]) == ws then reserve = tonumber(ARGV[11]) or 0 end
return window_take(KEYS[1], ws, ws + w, now, n, need, limit, keep, tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or -1, tonumber(ARGV[8]) or 0, ARGV[9] == '1', tonumber(ARGV[10]) or 0, reserve)
