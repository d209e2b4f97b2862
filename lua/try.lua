-- try.lua: reserve `quantity` of a bucket for one reservation (available -> reserved).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash     inv:{m:d:date}:stock
-- KEYS[2] fence hash     inv:{m:d:date}:reservation:<reservation_id>
-- KEYS[3] op record      inv:{m:d:date}:op:<operation_id>
-- ARGV[1] reservation_id   ARGV[2] operation_id   ARGV[3] quantity (>= 1)   ARGV[4] op TTL ms
--
-- Outcomes:
--   replay of the operation id      -> the stored first result, replayed=1
--   fence shows this op as its Try  -> SUCCEEDED, replayed=1 (op record expired; nothing moves)
--   no stock hash                   -> BUCKET_MISSING, nothing recorded (a retry after lazy init works)
--   state ~= OPEN                   -> BUCKET_CLOSED, nothing recorded
--   fence CANCELED/CONFIRMED/REFUNDED -> FENCED, recorded: a Try arriving after the Cancel
--                                      (hanging) must not freeze stock again
--   fence RESERVED by another op id -> SUCCEEDED without a move if the quantity matches (the
--                                      reservation already holds it; seed 5.4), else CONFLICT
--   available < quantity            -> INSUFFICIENT, recorded, no fence written
--   otherwise                       -> available -= q, reserved += q, fence RESERVED, SUCCEEDED
local reservation_id = arg_str(1, 'reservation_id')
local op = arg_str(2, 'operation_id')
local qty = arg_int(3, 'quantity', 1)
local ttl = arg_int(4, 'op ttl', 1)

local prev = replay(KEYS[3], 'TRY', reservation_id)
if prev then
  return prev
end

local f = read_fence(KEYS[2])
local s = read_stock(KEYS[1])
-- Checked before the bucket state: a replay of a Try that did reserve must not read as a
-- failure because the bucket closed since.
if f.try_op == op then
  return result('SUCCEEDED', s or ZERO, phase_out(f), false, true)
end
if not s then
  return result('BUCKET_MISSING', ZERO, phase_out(f), false, false)
end
if s.state ~= 'OPEN' then
  return result('BUCKET_CLOSED', s, phase_out(f), false, false)
end

local now = now_ms()
if f.phase == 'CANCELED' or f.phase == 'CONFIRMED' or f.phase == 'REFUNDED' then
  return record(KEYS[3], ttl, 'TRY', reservation_id, qty,
                result('FENCED', s, f.phase, false, false), now)
end
if f.phase == 'RESERVED' then
  local code = (f.quantity == qty) and 'SUCCEEDED' or 'CONFLICT'
  return record(KEYS[3], ttl, 'TRY', reservation_id, qty, result(code, s, f.phase, false, false), now)
end
if s.available < qty then
  return record(KEYS[3], ttl, 'TRY', reservation_id, qty,
                result('INSUFFICIENT', s, '', false, false), now)
end

s.available = s.available - qty
s.reserved = s.reserved + qty
check_stock(s)
write_stock(KEYS[1], s, now)
write_fence(KEYS[2], 'RESERVED',
  { 'quantity', qty, 'refunded', 0, 'try_op', op }, s.version, now, ttl)
return record(KEYS[3], ttl, 'TRY', reservation_id, qty, result('SUCCEEDED', s, 'RESERVED', false, false), now)
