-- wrk script of scripts/bench: Trys with ids nobody used before, one response log per thread.
--
--   wrk -t T -c C -d D -s wrk_try.lua URL -- MODE PREFIX MERCHANT DISH_BASE DISHES LOGDIR QUOTA
--
-- MODE single: POST /v1/reservations, one dish per request, dish = DISH_BASE + n % DISHES
--           (DISHES 1: the hot dish; 1000: cold dishes, spread round-robin).
-- MODE order:  POST /v1/orders/{id}/reservations with three items, dishes DISH_BASE..+2.
-- MODE repeat: as single, but each thread cycles over REPEAT_IDS order items: every request
--           after a thread's first REPEAT_IDS repeats a Try that settled (a client's retry).
-- Ids are strings (LuaJIT numbers are doubles): PREFIX (2 digits, one per wrk run of the
-- bench) .. thread (3 digits) .. counter (9 digits) = 14 digits, unique in the run; an order's
-- items append one digit. QUOTA > 0: each thread stops after that many responses.
-- Each thread writes "HTTP_STATUS ID OUTCOME" per response to LOGDIR/tNNN.log (ID is the
-- order_item_id, or the order id in order mode; OUTCOME is the reservation status, the error
-- code of an error body; for an order, ALL<n> when all_reserved, else the number of RESERVED
-- items or the first item error). stdio buffers are
-- flushed when wrk exits normally. done() prints one JSON line starting with "WRKJSON ".
-- WRK_AUTHORIZATION (environment): the value of an Authorization header sent with every
-- request (a caller token of a secured listener; never on the command line or in a log).

local REPEAT_IDS = 100
local HEADERS = { ["Content-Type"] = "application/json" }
if os.getenv("WRK_AUTHORIZATION") then HEADERS["Authorization"] = os.getenv("WRK_AUTHORIZATION") end

local threads = {}
local next_tid = 1

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
  table.insert(threads, thread)
end

local mode, prefix, merchant, dish_base, dishes, quota
local log
-- Globals, not locals: done() reads them from each thread with thread:get().
counter, answered, ok2xx, other = 0, 0, 0, 0

function init(args)
  mode, prefix, merchant = args[1], args[2], args[3]
  dish_base, dishes = tonumber(args[4]), tonumber(args[5])
  quota = tonumber(args[7] or "0")
  log = assert(io.open(string.format("%s/t%03d.log", args[6], tid), "w"))
  -- Full buffering: one write per few KB, not per response.
  log:setvbuf("full", 65536)
end

function request()
  counter = counter + 1
  local n = counter
  if mode == "repeat" then n = counter % REPEAT_IDS end
  local id = prefix .. string.format("%03d%09d", tid, n)
  if mode ~= "order" then
    local dish = dish_base + (counter % dishes)
    local body = '{"order_id":' .. id .. ',"order_item_id":' .. id .. ',"merchant_id":' .. merchant ..
      ',"dish_id":' .. string.format("%d", dish) .. ',"quantity":1,"order_type":"INSTANT"}'
    return wrk.format("POST", "/v1/reservations", HEADERS, body)
  end
  local items = {}
  for k = 0, 2 do
    items[#items + 1] = '{"order_item_id":' .. id .. k .. ',"dish_id":' ..
      string.format("%d", dish_base + k) .. ',"quantity":1}'
  end
  local body = '{"merchant_id":' .. merchant .. ',"order_type":"INSTANT","items":[' ..
    table.concat(items, ",") .. ']}'
  return wrk.format("POST", "/v1/orders/" .. id .. "/reservations", HEADERS, body)
end

function response(status, headers, body)
  answered = answered + 1
  if status >= 200 and status < 300 then ok2xx = ok2xx + 1 else other = other + 1 end
  local id, outcome
  if mode ~= "order" then
    id = string.match(body, '"order_item_id":%s*(%d+)')
    outcome = string.match(body, '"status":%s*"(%u+)"') or string.match(body, '"error":%s*"([%w_]+)"')
  else
    id = string.match(body, '"order_id":%s*(%d+)')
    -- An item's answer names RESERVED twice (its status and its reservation's), so the
    -- count of RESERVED items is read from the items' own "status" next to "dish_id".
    local n = 0
    for _ in string.gmatch(body, '"dish_id":%s*%d+,%s*"status":%s*"RESERVED"') do n = n + 1 end
    if string.match(body, '"all_reserved":%s*true') then
      outcome = "ALL" .. n
    else
      outcome = string.match(body, '"error":%s*"([%w_]+)"') or tostring(n)
    end
  end
  log:write(status, " ", id or "-", " ", outcome or "-", "\n")
  if quota > 0 and answered >= quota then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local sent, ok, bad = 0, 0, 0
  for _, t in ipairs(threads) do
    sent = sent + (t:get("counter") or 0)
    ok = ok + (t:get("ok2xx") or 0)
    bad = bad + (t:get("other") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"generated":%d,"ok2xx":%d,"non2xx":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"status_errors":%d,"timeouts":%d,' ..
    '"lat_mean_us":%.1f,"lat_max_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d}\n',
    summary.requests, summary.duration, sent, ok, bad, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
