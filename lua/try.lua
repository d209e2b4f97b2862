-- try.lua: reserve `quantity` of a bucket for one reservation (available -> reserved).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash     inv:{m:d:date}:stock
-- KEYS[2] fence hash     inv:{m:d:date}:reservation:<reservation_id>
-- KEYS[3] op record      inv:{m:d:date}:op:<operation_id>
-- ARGV[1] reservation_id   ARGV[2] operation_id   ARGV[3] quantity (>= 1)   ARGV[4] op TTL ms
--
-- A group of Trys in one bucket (group commit, issue 12): n items, item i with its own
-- KEYS[2i] fence, KEYS[2i+1] op record and ARGV[4i-3..4i] as above. Items run in order, each
-- exactly as its own call of this script would (each sees the stock the ones before it left),
-- and the reply is an array of n replies. An item that raises (an operation id reused, an
-- invariant broken) answers {'ERR', message} in its place and, like a lone call, changes
-- nothing: its checks come before its writes. One item = the lone call, with its flat reply.
--
-- Outcomes:
--   replay of the operation id      -> the stored first result, replayed=1
--   fence shows this op as its Try  -> SUCCEEDED, replayed=1 (op record expired; nothing moves)
--   no stock hash                   -> BUCKET_MISSING, nothing recorded (a retry after lazy init works)
--   state ~= OPEN                   -> BUCKET_CLOSED, nothing recorded
--   fence CANCELED/CONFIRMED/REFUNDED -> FENCED, recorded: a Try arriving after the Cancel
--                                      (hanging) must not freeze stock again
--   fence RESERVED by another op id -> SUCCEEDED without a move if the quantity matches (the
--                                      reservation already holds it; docs/design.md, fence), else CONFLICT
--   available < quantity            -> INSUFFICIENT, recorded, no fence written
--   otherwise                       -> available -= q, reserved += q, fence RESERVED, SUCCEEDED
local function try_one(i)
  local fence_key, op_key = KEYS[2 * i], KEYS[2 * i + 1]
  local a = 4 * (i - 1)
  local reservation_id = arg_str(a + 1, 'reservation_id')
  local op = arg_str(a + 2, 'operation_id')
  local qty = arg_int(a + 3, 'quantity', 1)
  local ttl = arg_int(a + 4, 'op ttl', 1)

  local prev = replay(op_key, 'TRY', reservation_id)
  if prev then
    return prev
  end

  local f = read_fence(fence_key)
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
    return record(op_key, ttl, 'TRY', reservation_id, qty,
                  result('FENCED', s, f.phase, false, false), now)
  end
  if f.phase == 'RESERVED' then
    local code = (f.quantity == qty) and 'SUCCEEDED' or 'CONFLICT'
    return record(op_key, ttl, 'TRY', reservation_id, qty, result(code, s, f.phase, false, false), now)
  end
  if s.available < qty then
    return record(op_key, ttl, 'TRY', reservation_id, qty,
                  result('INSUFFICIENT', s, '', false, false), now)
  end

  s.available = s.available - qty
  s.reserved = s.reserved + qty
  check_stock(s)
  write_stock(KEYS[1], s, now)
  write_fence(fence_key, 'RESERVED',
    { 'quantity', qty, 'refunded', 0, 'try_op', op }, s.version, now, ttl)
  return record(op_key, ttl, 'TRY', reservation_id, qty, result('SUCCEEDED', s, 'RESERVED', false, false), now)
end

local n = (#KEYS - 1) / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= 4 * n then
  fail('a Try takes 1 + 2n keys and 4n arguments, got ' .. #KEYS .. ' keys and ' .. #ARGV ..
       ' arguments')
end
if n == 1 then
  return try_one(1)
end
local replies = {}
for i = 1, n do
  local ok, res = pcall(try_one, i)
  if ok then
    replies[i] = res
  else
    -- Redis 7 hands pcall the error reply's text ('ERR stocksvr: ...', 'WRONGTYPE ...');
    -- older servers the error table. A plain Lua error has no code: it gets ERR.
    local message = (type(res) == 'table' and res.err) or tostring(res)
    if not string.find(message, '^[A-Z]+ ') then
      message = 'ERR ' .. message
    end
    replies[i] = { 'ERR', message }
  end
end
return replies
