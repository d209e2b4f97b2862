-- cancel.lua: roll a reservation back (reserved -> available), or fence it if its Try never
-- reached Redis. Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] fence hash   KEYS[3] op record
-- ARGV[1] reservation_id   ARGV[2] operation_id   ARGV[3] quantity (>= 1)   ARGV[4] op TTL ms
-- ARGV[5] '1' when the bucket was never built (no init succeeded), '' otherwise
-- ARGV[6] '1': fence only (a Try giving up its row: its bucket lost, or its day closed before
--         the bucket was built), always with ARGV[5] '1' so the fence is written without the
--         stock hash too; a RESERVED fence is left as it is, see below; absent or '' otherwise
--
-- Outcomes:
--   replay of the operation id         -> the stored first result, replayed=1
--   fence shows this op as its Cancel  -> SUCCEEDED, replayed=1 (op record expired)
--   no stock hash, ARGV[5] ~= '1' -> BUCKET_MISSING, nothing recorded: the bucket was built,
--                    so Redis lost it with its fences, and judging the missing fence as
--                    "the Try never ran" would release nothing for a reservation that holds
--                    stock. A Cancel passes ARGV[5] = '1' only after MySQL showed that the
--                    bucket was never built; the fence-only call (ARGV[6]) always does, as it
--                    releases nothing whatever it finds.
--   fence NONE    -> empty rollback (docs/design.md, fence): writes a CANCELED fence carrying ARGV quantity,
--                    adds NO stock, SUCCEEDED with empty_rollback=1. Done even when the stock
--                    hash of a never-built bucket is missing: the Try may be waiting for a lazy
--                    init, and without the fence it would freeze stock after this Cancel
--                    (hanging, docs/design.md, fence).
--   fence CANCELED -> SUCCEEDED, no change (idempotent across operation ids); empty_rollback
--                    tells whether the first Cancel was an empty rollback (no Try ever set try_op)
--   fence CONFIRMED/REFUNDED -> CONFLICT, recorded (a sale is undone by refund, never by cancel)
--   fence RESERVED, ARGV[6] = '1' -> CONFLICT with phase RESERVED, nothing changed or
--                    recorded: another copy of the Try ran (after a rebuild, or in the bucket a
--                    lazy init racing the day's close built) and holds stock
--                    that is the reservation's own steps' to settle and book; releasing it here
--                    would leave a reservation MySQL may answer as RESERVED with nothing held
--   fence RESERVED -> the held quantity (fence quantity - refunded; the fence, not ARGV, is the
--                    truth) goes back: reserved -= held, available += held (paying a deficit
--                    first), fence CANCELED. Allowed in any bucket state.
local reservation_id = arg_str(1, 'reservation_id')
local op = arg_str(2, 'operation_id')
local qty = arg_int(3, 'quantity', 1)
local ttl = arg_int(4, 'op ttl', 1)
local never_built = ARGV[5] == '1'
local fence_only = ARGV[6] == '1'

local prev = replay(KEYS[3], 'CANCEL', reservation_id)
if prev then
  return prev
end

local f = read_fence(KEYS[2])
local s = read_stock(KEYS[1])
if f.cancel_op == op then
  return result('SUCCEEDED', s or ZERO, phase_out(f), f.try_op == '', true)
end

if not s and not never_built then
  return result('BUCKET_MISSING', ZERO, phase_out(f), false, false)
end

local now = now_ms()
if f.phase == 'NONE' then
  local version = s and s.version or 0
  write_fence(KEYS[2], 'CANCELED',
    { 'quantity', qty, 'refunded', 0, 'cancel_op', op }, version, now, ttl)
  return record(KEYS[3], ttl, 'CANCEL', reservation_id, qty,
                result('SUCCEEDED', s or ZERO, 'CANCELED', true, false), now)
end
if f.phase == 'CANCELED' then
  return record(KEYS[3], ttl, 'CANCEL', reservation_id, 0,
                result('SUCCEEDED', s or ZERO, 'CANCELED', f.try_op == '', false), now)
end
if f.phase == 'RESERVED' and fence_only then
  return result('CONFLICT', s or ZERO, f.phase, false, false)
end
if f.phase ~= 'RESERVED' then
  return record(KEYS[3], ttl, 'CANCEL', reservation_id, 0,
                result('CONFLICT', s or ZERO, f.phase, false, false), now)
end
if not s then
  return result('BUCKET_MISSING', ZERO, f.phase, false, false)
end

local held = f.quantity - f.refunded
s.reserved = s.reserved - held
local paid = release(s, held)
check_stock(s)
write_stock(KEYS[1], s, now)
write_fence(KEYS[2], 'CANCELED', { 'cancel_op', op }, s.version, now, ttl)
return record(KEYS[3], ttl, 'CANCEL', reservation_id, held,
              result('SUCCEEDED', s, 'CANCELED', false, false, paid), now)
