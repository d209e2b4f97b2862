-- _common.lua: the prelude shared by every stocksvr inventory script.
--
-- It is not a script of its own: processors/store/src/lua.rs prepends it to each script file
-- (concat! of include_str!), so the text Redis hashes and runs is "_common.lua .. <script>.lua".
-- EVAL has no `require`, and one copy of these helpers keeps the result layout, the op record
-- and the invariant checks identical in all scripts. To run a script by hand:
--   cat lua/_common.lua lua/try.lua > /tmp/try.lua && redis-cli --eval /tmp/try.lua ...
--
-- Conventions of every script:
--   * every key is passed in KEYS (never built here), and all keys of one call share the hash
--     tag {merchant_id:dish_id:stock_date}, so a call is cluster-safe (one slot);
--   * every argument is validated before the first write: Redis does not roll back a script
--     that fails half-way, so a script either raises before touching anything or runs to the end;
--   * the reply is the flat array
--       {code, version, total, available, reserved, sold, phase, empty_rollback, replayed, deficit,
--        paid}
--     and the same array (with replayed=1) is what a replay of the operation id returns.
--     `paid` is the part of a cancel's or refund's released quantity that went to pay down a
--     deficit instead of becoming available (0 for every other step): the ledger books the
--     available delta the step really made, so ledger and Redis agree after a deficit;
--   * a step of a reservation never judges its fence while the stock hash is missing: a
--     missing hash of a bucket that was built means Redis lost it (fences included), so the
--     step answers BUCKET_MISSING and changes nothing until the bucket is rebuilt.

-- The numbers a result reports when the stock hash does not exist.
local ZERO = { total = 0, available = 0, reserved = 0, sold = 0, version = 0, state = '',
               baseline_version = 0, deficit = 0 }

-- Raise an error reply. Only called before the first write of a script (see above), or when
-- the stored numbers break an invariant, in which case refusing loudly is better than moving
-- them further and the caller keeps the operation for a retry after repair.
local function fail(message)
  error({ err = 'ERR stocksvr: ' .. message })
end

-- Integral ARGV[i] >= min. Quantities and totals are far below 2^53, so doubles are exact.
local function arg_int(i, name, min)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < min then
    fail('invalid ' .. name .. ': ' .. tostring(ARGV[i]))
  end
  return v
end

-- Non-empty ARGV[i] (operation and reservation ids).
local function arg_str(i, name)
  local v = ARGV[i]
  if v == nil or v == '' then
    fail('missing ' .. name)
  end
  return v
end

-- Milliseconds from the Redis clock, so every writer agrees on one time source.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The stock hash as numbers, or nil when the bucket does not exist. `total` is written only by
-- init_bucket, so its absence means "never initialised" (or expired after ARCHIVED).
local function read_stock(key)
  local v = redis.call('HMGET', key, 'total', 'available', 'reserved', 'sold', 'version',
                       'state', 'baseline_version', 'deficit')
  if not v[1] then
    return nil
  end
  return {
    total = tonumber(v[1]) or 0,
    available = tonumber(v[2]) or 0,
    reserved = tonumber(v[3]) or 0,
    sold = tonumber(v[4]) or 0,
    version = tonumber(v[5]) or 0,
    state = v[6] or '',
    baseline_version = tonumber(v[7]) or 0,
    deficit = tonumber(v[8]) or 0,
  }
end

-- Guard of every quantity move: nothing negative. A violation means the hash was edited outside
-- these scripts; stop instead of spreading it (raised before any write of the call).
local function check_stock(s)
  if s.available < 0 or s.reserved < 0 or s.sold < 0 or s.deficit < 0 then
    fail('invariant violated: available=' .. s.available .. ' reserved=' .. s.reserved ..
         ' sold=' .. s.sold .. ' deficit=' .. s.deficit)
  end
end

-- Bumps the version and writes the absolute numbers back in one HSET.
local function write_stock(key, s, now)
  s.version = redis.call('HINCRBY', key, 'version', 1)
  redis.call('HSET', key,
    'total', s.total, 'available', s.available, 'reserved', s.reserved, 'sold', s.sold,
    'deficit', s.deficit, 'updated_at', now)
end

-- Quantity coming back (cancel, refund) first pays down a deficit left by an adjust below
-- reserved + sold, so available + reserved + sold == total + deficit holds throughout and the
-- plain invariant available + reserved + sold == total holds whenever deficit is 0.
local function release(s, qty)
  local pay = math.min(s.deficit, qty)
  s.deficit = s.deficit - pay
  s.available = s.available + qty - pay
  return pay
end

-- The reservation fence; phase 'NONE' when the key does not exist.
local function read_fence(key)
  local f = redis.call('HMGET', key, 'phase', 'quantity', 'refunded', 'try_op', 'confirm_op',
                       'cancel_op', 'last_refund_op')
  return {
    phase = f[1] or 'NONE',
    quantity = tonumber(f[2]) or 0,
    refunded = tonumber(f[3]) or 0,
    try_op = f[4] or '',
    confirm_op = f[5] or '',
    cancel_op = f[6] or '',
    last_refund_op = f[7] or '',
  }
end

-- Writes the fence: its phase, the other changed fields, version and updated_at. A RESERVED
-- fence never expires: losing it would turn a later Cancel into an empty rollback and leak the
-- held stock. Any other phase expires with the op records, whose TTL is chosen to outlive the
-- longest order lifecycle plus retries and repair (docs/design.md, op records), so it still fences any late Try.
local function write_fence(key, phase, fields, version, now, ttl_ms)
  redis.call('HSET', key, 'phase', phase, 'version', version, 'updated_at', now, unpack(fields))
  if phase == 'RESERVED' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, ttl_ms)
  end
end

-- Phase as reported to the caller: '' for no fence (the Rust side maps it to None).
local function phase_out(f)
  if f == nil or f.phase == 'NONE' then
    return ''
  end
  return f.phase
end

local function result(code, s, phase, empty_rollback, replayed, paid)
  return { code, s.version, s.total, s.available, s.reserved, s.sold, phase,
           empty_rollback and 1 or 0, replayed and 1 or 0, s.deficit, paid or 0 }
end

-- The stored first result of an operation id, returned unchanged with replayed=1. An id reused
-- for another action or reservation is a caller bug: refuse it rather than answer for the
-- other operation.
local function replay(op_key, action, reservation_id)
  local r = redis.call('HMGET', op_key, 'code', 'version', 'total', 'available', 'reserved',
                       'sold', 'phase', 'empty_rollback', 'deficit', 'action', 'reservation_id',
                       'paid')
  if not r[1] then
    return nil
  end
  if r[10] ~= action or r[11] ~= reservation_id then
    fail('operation id reused: recorded for ' .. tostring(r[10]) .. ' of reservation ' ..
         tostring(r[11]) .. ', now ' .. action .. ' of reservation ' .. reservation_id)
  end
  return { r[1], tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), tonumber(r[5]), tonumber(r[6]),
           r[7], tonumber(r[8]), 1, tonumber(r[9]), tonumber(r[12]) or 0 }
end

-- Stores the complete result under the operation id, in the same script as the effect, so a
-- retry after a lost reply gets this answer instead of a second effect (docs/design.md, op records).
local function record(op_key, ttl_ms, action, reservation_id, quantity, res, now)
  redis.call('HSET', op_key,
    'action', action, 'reservation_id', reservation_id, 'code', res[1], 'version', res[2],
    'total', res[3], 'available', res[4], 'reserved', res[5], 'sold', res[6], 'phase', res[7],
    'empty_rollback', res[8], 'deficit', res[10], 'paid', res[11], 'quantity', quantity,
    'operated_at', now)
  redis.call('PEXPIRE', op_key, ttl_ms)
  return res
end

-- ---- end of _common.lua --------------------------------------------------------------------
