#!/usr/bin/env sysbench
-- "The SQL a Try runs, without Redis or HTTP": replays the statements one Try issued (captured
-- from MariaDB's general log by tests/bench/trysql.py) with fresh ids per event, in the same
-- order, over the text protocol, autocommit except where the capture has BEGIN ... COMMIT.
--   sysbench sysbench_replay.lua --template=FILE --prefix=8 --threads=16 --time=20 run
-- FILE holds one statement per line with the placeholders {RID} (reservation id), {OID}
-- (order id) and {IID} (order item id). Ids are strings: 19 digits do not fit a double.

sysbench.cmdline.options = {
  template = { "file of statements, one per line, with {RID} {OID} {IID}", "" },
  prefix = { "first digit of the generated ids (1-8)", "8" },
}

function thread_init()
  stmts = {}
  for line in io.lines(sysbench.opt.template) do
    if line ~= "" then
      stmts[#stmts + 1] = line
    end
  end
  drv = sysbench.sql.driver()
  con = drv:connect()
  n = 0
end

local function fill(s, rid, oid, iid)
  -- gsub returns two values; the parentheses keep only the string.
  s = (string.gsub(s, "{RID}", rid))
  s = (string.gsub(s, "{OID}", oid))
  return (string.gsub(s, "{IID}", iid))
end

function event()
  n = n + 1
  local tail = string.format("%03d%014d", sysbench.tid, n)
  local rid = sysbench.opt.prefix .. "1" .. tail
  local oid = sysbench.opt.prefix .. "2" .. tail
  local iid = sysbench.opt.prefix .. "3" .. tail
  for i = 1, #stmts do
    con:query(fill(stmts[i], rid, oid, iid))
  end
end

function thread_done()
  con:disconnect()
end
