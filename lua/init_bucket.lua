-- init_bucket.lua: create a day's bucket from its baseline (seed 12.1).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] op record
-- ARGV[1] operation_id   ARGV[2] total (>= 0)   ARGV[3] baseline_version (>= 0)   ARGV[4] op TTL ms
--
-- Outcomes:
--   replay of the operation id -> the stored first result, replayed=1
--   no stock hash              -> total = available = ARGV total, reserved = sold = deficit = 0,
--                                 version 1, state OPEN
--   stored baseline_version >= ARGV baseline_version
--                              -> SUCCEEDED, no change (a duplicate or stale init; concurrent lazy
--                                 inits of one bucket converge here)
--   lower stored baseline, bucket untouched (reserved = sold = 0, available = total)
--                              -> re-initialised from the newer baseline; the version keeps
--                                 growing (projections only accept newer versions)
--   lower stored baseline, bucket has traded
--                              -> CONFLICT: never overwrite a traded bucket, adjust is the way
-- Everything except a replay is recorded. The phase slot (unused: no reservation) says what
-- happened, because only a bucket that came into being may be booked as an init in the ledger:
--   INITIALIZED (created), REINITIALIZED (untouched bucket rebuilt from a newer baseline),
--   UNCHANGED (the stored baseline was the same or newer; the numbers are the current ones).
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

if s.baseline_version >= baseline then
  return record(KEYS[2], ttl, 'INIT', '', total, result('SUCCEEDED', s, 'UNCHANGED', false, false), now)
end
if s.reserved ~= 0 or s.sold ~= 0 or s.available ~= s.total then
  return record(KEYS[2], ttl, 'INIT', '', total, result('CONFLICT', s, '', false, false), now)
end

s.total = total
s.available = total
s.deficit = 0
write_stock(KEYS[1], s, now)
redis.call('HSET', KEYS[1], 'baseline_version', baseline)
return record(KEYS[2], ttl, 'INIT', '', total, result('SUCCEEDED', s, 'REINITIALIZED', false, false), now)
