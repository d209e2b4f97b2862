#!/usr/bin/env sysbench
-- The bare MariaDB baseline of scripts/bench: one hot-row conditional UPDATE per event,
-- autocommit, on the table bench_hot the bench creates (id 1, available far above the run).
--   sysbench sysbench_hotrow.lua --mysql-host=... --threads=64 --time=20 run

function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end

function event()
  con:query("UPDATE bench_hot SET available = available - 1 WHERE id = 1 AND available >= 1")
end

function thread_done()
  con:disconnect()
end
