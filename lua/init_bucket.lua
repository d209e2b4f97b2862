-- init_bucket.lua: create a day's bucket from its baseline (docs/design.md, daily buckets).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] op record
-- ARGV[1] operation_id   ARGV[2] total (>= 0)   ARGV[3] baseline_version (>= 0)   ARGV[4] op TTL ms
--
-- Outcomes:
--   replay of the operation id -> the stored first result, replayed=1
--   no stock hash              -> total = available = ARGV total, reserved = sold = deficit = 0,
--                                 version 1, state OPEN; phase INITIALIZED
--   a stock hash exists        -> SUCCEEDED, no change, phase UNCHANGED: whatever its baseline, a
--                                 bucket is never rebuilt by an init (a newer total reaches it
--                                 through adjust, which books the difference; rebuilding would
--                                 book the whole total a second time, or erase trades)
-- Everything except a replay is recorded. The phase slot (unused: no reservation) says what
-- happened, because only a bucket that came into being may be booked as an init in the ledger.
local op = arg_str(1, 'operation_id')
local total = arg_int(2, 'total', 0)
local baseline = arg_int(3, 'baseline_version', 0)
local ttl = arg_int(4, 'op ttl', 1)

local prev = replay(KEYS[2], 'INIT', '')
if prev then
  return prev
end

local now = now_ms()
local s = read_stock(KEYS[1])
if not s then
  s = { total = total, available = total, reserved = 0, sold = 0, version = 1, state = 'OPEN',
        baseline_version = baseline, deficit = 0 }
  redis.call('HSET', KEYS[1],
    'total', total, 'available', total, 'reserved', 0, 'sold', 0, 'version', 1, 'state', 'OPEN',
    'baseline_version', baseline, 'deficit', 0, 'updated_at', now)
  return record(KEYS[2], ttl, 'INIT', '', total, result('SUCCEEDED', s, 'INITIALIZED', false, false), now)
end

return record(KEYS[2], ttl, 'INIT', '', total, result('SUCCEEDED', s, 'UNCHANGED', false, false), now)
