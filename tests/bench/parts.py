"""The measuring parts of a bench run, in the order run.py calls them. Each adds its figures to
bench.fig and records its phases (what every process used meanwhile)."""

import concurrent.futures
import json
import os
import statistics
import time

import checks
import loads
import pipeline
import trysql
from bench import BIG, COLD_BASE, HOT_DISH, ORDER_DISH, REPO, MetricsWatch
from stocksvr_harness import codes, kafka
from stocksvr_harness.wait import WaitTimeout, wait_until
from system import BenchError, http

_prefix = iter(range(10, 100))  # the 2-digit id prefix of each wrk run (tests/bench/lua/wrk_try.lua)


def _lua(*names):
    return "".join(open(os.path.join(REPO, "lua", n), encoding="utf-8").read() for n in names)


def init_buckets(b, api):
    """Today's buckets of the bench merchant through the admin API (WAL + Lua, like an
    operator's): the hot dish, the three dishes of the order-level Trys, the cold dishes."""
    dishes = [HOT_DISH] + [ORDER_DISH + k for k in range(3)] + [COLD_BASE + k for k in range(b.P["cold_dishes"])]
    headers = {"content-type": "application/json", "authorization": f"Bearer {b.token}"}

    def one(dish):
        st, text = http("POST", api + "/admin/buckets", json.dumps(
            {"merchant_id": b.merchant, "dish_id": dish, "total": BIG}), headers)
        return dish, st, text

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        bad = [(d, st, t[:200]) for d, st, t in ex.map(one, dishes) if st != 200]
    if bad:
        raise BenchError(f"{len(bad)} bucket inits failed, e.g. {bad[:3]}")
    return len(dishes)


def part_capture(b):
    """MariaDB statements of a Try on its own (sequential Trys against `stocksvr
    order-lifecycle` alone), and the statement template of the replay baseline."""
    b.log("the SQL of a Try: stocksvr order-lifecycle alone, sequential Trys, MariaDB general log")
    r = b.role("order-lifecycle", 88)
    n = init_buckets(b, r.url(""))
    b.log(f"{n} buckets initialised through POST /admin/buckets")
    bucket = b.db.one("SELECT stock_bucket_id FROM dish_stock_baseline WHERE merchant_id = %s AND dish_id = %s",
                      (b.merchant, HOT_DISH))
    with b.phase("api-alone-idle") as idle:
        time.sleep(3)
    idle_rate = idle["mysql"]["Questions"] / (idle["t1"] - idle["t0"])
    seq = 50 if b.mode == "full" else 20
    headers = {"content-type": "application/json"}
    with b.phase("try-sequential") as rec:
        for k in range(seq):
            oid = 710_000_000 + k
            st, text = http("POST", r.url("/v1/reservations"), json.dumps({
                "order_id": oid, "order_item_id": oid, "merchant_id": b.merchant, "dish_id": HOT_DISH,
                "quantity": 1, "order_type": "INSTANT"}), headers)
            if st != 201 or json.loads(text)["reservation"]["status"] != "RESERVED":
                raise BenchError(f"sequential Try answered {st}: {text[:300]}")
            b.extra_items.add(oid)
    secs = rec["t1"] - rec["t0"]
    q = rec["mysql"]
    per_try = (q["Questions"] - idle_rate * secs) / seq
    b.fig.add("stmts_per_try_seq", "MariaDB statements per Try, sequential, API process alone", per_try,
              "stmt/Try", note=f"{seq} Trys; {q['Com_commit'] / seq:.1f} COMMIT, "
              f"{q['log_flushes'] / seq:.1f} log flushes per Try; idle {idle_rate:.1f} stmt/s subtracted")
    b.fig.add("try_latency_seq", "Try through HTTP, one at a time (c=1, API process alone)", seq / secs,
              note="python client, sequential")
    b.stop_role(r)
    # MariaDB writes a prepared statement's values into the general log only when the log was
    # on at its PREPARE (it decides then whether to expand the parameters), and stocksvr
    # prepares once per connection: so the log goes on first, then a fresh process.
    log_path = os.path.join(b.logs, "general.log")
    trysql.general_log(b.admin, log_path, True)
    try:
        r = b.role("order-lifecycle", 88)
        template, counts, captured, warm = trysql.capture(
            r.url(""), b.merchant, HOT_DISH, bucket, log_path, 720_000_000,
            lambda text: b.admin.q("SELECT %s", (text,)), lambda: trysql.general_log(b.admin, log_path, False))
    finally:
        trysql.general_log(b.admin, log_path, False)
    for _oid, iid, _ in captured + warm:
        b.extra_items.add(iid)
    path = os.path.join(b.out, "try-sql.txt")
    with open(path, "w") as f:
        f.write("\n".join(template) + "\n")
    b.template = path
    b.template_len = len(template)
    b.log(f"a Try issues {len(template)} statements (captures of {len(counts)} Trys: {counts}); {path}")
    if len(set(counts)) > 1:
        b.notes.append(f"captured Trys issued different statement counts {counts}; the most common shape is replayed")
    # The replay reads the bucket's baseline and the merchant's time zone like a Try does.
    for table in ("dish_stock_baseline", "merchant_settings"):
        b.admin.q(f"INSERT INTO `{b.sidedb}`.{table} SELECT * FROM `{b.dbname}`.{table} WHERE merchant_id = %s",
                  (b.merchant,))
    b.stop_role(r)


def part_bare(b):
    """The baselines without stocksvr running: try.lua via redis-benchmark, one hot-row UPDATE
    and the Try's own statements via sysbench."""
    lua_log = os.path.join(b.logs, "redis-benchmark.log")
    sha = b.redis.script_load(_lua("_common.lua", "try.lua"))
    tag = f"bench:{b.ns}:lua"
    b.redis.eval(_lua("_common.lua", "init_bucket.lua"), 2, f"inv:{{{tag}}}:stock", f"inv:{{{tag}}}:op:init",
                 "op_init", 10 ** 12, 1, 86_400_000)
    b.log(f"bare try.lua: redis-benchmark EVALSHA, 64 clients, {b.P['lua_requests']:,} calls")
    with b.phase("bare-lua-64") as rec:
        res = loads.redis_benchmark(b.stack.redis_port, sha, tag, 64, b.P["lua_requests"], lua_log)
        rec["gen_cpu_pct"] = res["gen_cpu_pct"]
    b.fig.add("bare_lua", "bare try.lua via redis-benchmark EVALSHA, 64 clients", res["rate"],
              p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=64)
    b.raw["bare_lua"] = res

    side = b.stack.db(b.sidedb)
    side.q("CREATE TABLE bench_hot (id INT PRIMARY KEY, available BIGINT NOT NULL) ENGINE=InnoDB")
    side.q("INSERT INTO bench_hot VALUES (1, %s)", (10 ** 15,))
    dbargs = ("127.0.0.1", b.stack.mysql_port, "stocksvr", b.stack.password, b.sidedb)
    sb_log = os.path.join(b.logs, "sysbench.log")
    b.log(f"bare MariaDB hot-row UPDATE: sysbench, 64 threads, {b.P['sql_secs']} s")
    with b.phase("bare-update-64") as rec:
        res = loads.sysbench("sysbench_hotrow.lua", dbargs, 64, b.P["sql_secs"], sb_log)
        rec["gen_cpu_pct"] = res["gen_cpu_pct"]
    b.fig.add("bare_update", "bare MariaDB hot-row UPDATE, autocommit, 64 threads", res["rate"],
              p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=64)
    b.raw["bare_update"] = res
    for threads in (16, 64):
        b.log(f"the SQL a Try runs, replayed: sysbench, {threads} threads, {b.P['sql_secs']} s")
        before = side.one(f"SELECT COUNT(*) FROM inventory_reservation WHERE status = {codes.RESERVED}")
        with b.phase(f"try-sql-{threads}") as rec:
            res = loads.sysbench("sysbench_replay.lua", dbargs, threads, b.P["sql_secs"], sb_log,
                                 extra=[f"--template={b.template}", f"--prefix={threads % 7 + 1}"])
            rec["gen_cpu_pct"] = res["gen_cpu_pct"]
        landed = side.one(f"SELECT COUNT(*) FROM inventory_reservation WHERE status = {codes.RESERVED}") - before
        b.fig.add(f"try_sql_{threads}",
                  f"the SQL a Try runs ({b.template_len} statements, replayed), {threads} threads", res["rate"],
                  p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=threads,
                  note=f"{landed:,} rows RESERVED for {res['events']:,} replays")
        b.raw[f"try_sql_{threads}"] = res
    side.close()


def _metrics(b, r, when):
    """(role, its /metrics) of r, or of the process that replaced r if r has exited (see
    Bench.revive); a failed scrape is retried once after a moment, in case r is exiting."""
    for attempt in range(3):
        r = b.revive(r, when) or r
        try:
            return r, r.metrics()
        except OSError:
            if attempt == 2:
                raise
            time.sleep(1)


def wrk_load(b, r, name, mode, conns, secs, dish_base, dishes, quota=0, stop_when=None):
    prefix = next(_prefix)
    r, m0 = _metrics(b, r, f"before the load {name}")
    with b.phase(name, tables=True) as rec:
        res = loads.wrk(r.url(""), conns, secs, os.path.join(b.out, "wrk", name), mode, prefix,
                        b.merchant, dish_base, dishes, os.path.join(b.logs, "wrk.log"), quota=quota,
                        stop_when=stop_when)
        rec["gen_cpu_pct"] = res["gen_cpu_pct"]
    time.sleep(0.5)  # an exit caused by the load's end shows by now
    new = b.revive(r, f"at the end of the load {name}")
    died = new.note if new else None
    m1 = None
    if not new:
        try:
            m1 = r.metrics()
        except OSError:  # exiting after all: the next _metrics or quiet restarts it
            pass
    b.runs.append((mode, res["responses"]))
    items = res["ok2xx"] * (3 if mode == "order" else 1)
    q = rec["mysql"]
    res["trys"] = items
    res["stmts_per_try"] = q["Questions"] / items if items else None
    res["mix"] = ", ".join(f"{q[k] / items:.1f} {k[4:].upper()}" for k in
                           ("Com_select", "Com_insert", "Com_update", "Com_commit") if items)
    res["fsyncs_per_try"] = q["log_flushes"] / items if items else None
    res["lua_per_try"] = rec["redis"]["evalsha"] / items if items else None
    res["delay_p99"], res["delay_n"] = (pipeline.histogram_quantile(m0, m1, "stocksvr_projection_delay_seconds", 0.99)
                                        if m1 else (None, 0))
    res["delay_over_100ms"] = (pipeline.histogram_share_over(m0, m1, "stocksvr_projection_delay_seconds", 0.1)
                               if m1 else None)
    if b.watch:
        res["backlog_max"], res["oldest_max"] = b.watch.max_between(rec["t0"], rec["t1"])
    bad = res["requests"] - res["ok2xx"]
    res["pings_per_try"] = q["Com_admin_commands"] / items if items else None
    res["rows_per_try"] = {label: q[f"Handler_{k}"] / items for k, label in
                           (("write", "inserted"), ("update", "updated"), ("delete", "deleted"),
                            ("read_key", "key lookups"))} if items else None
    res["note"] = (f"{res['stmts_per_try']:.1f} stmt/Try ({res['mix']}), {res['pings_per_try']:.2f} pings/Try, "
                   f"{res['fsyncs_per_try']:.2f} log flushes/Try; rows/Try "
                   + ", ".join(f"{v:.1f} {k}" for k, v in res["rows_per_try"].items()) if items else "no 2xx")
    res["rows_changed_per_try"] = b.rows_changed(rec, items)
    tables = b.table_line(rec, items, "Try")
    if tables:
        res["note"] += "; " + tables
    if items and (q["Com_rollback"] or q["Innodb_deadlocks"]):
        res["note"] += (f"; {q['Com_rollback'] / items:.3f} rollbacks/Try ({q['Com_rollback']:,.0f}), "
                        f"{q['Innodb_deadlocks']:,.0f} deadlocks")
    if items and m1:
        res["note"] += "; " + _groups(m0, m1)
    if bad or res["timeouts"] or res["socket_errors"]:
        codes = {}
        for st, _, outcome in res["responses"]:
            if not 200 <= st < 300:
                codes[f"{st} {outcome}"] = codes.get(f"{st} {outcome}", 0) + 1
        res["note"] += f"; non-2xx {bad} {codes}, timeouts {res['timeouts']}, socket errors {res['socket_errors']}"
    if died:
        res["note"] += f"; {died}"
    b.raw[name] = {k: v for k, v in res.items() if k != "responses"}
    return res


def _rows_figure(b, key, label, res):
    """The rows a load changed per Try over every table (the API's writes and, in the same
    seconds, the relay's and the projector's for those Trys), as a figure of its own."""
    if res.get("rows_changed_per_try") is not None:
        b.fig.add(key, label, res["rows_changed_per_try"], "rows/Try",
                  note="information_schema.table_statistics rows_changed delta / 2xx Trys; issue 48 target <= 4")


def _groups(m0, m1):
    """Group commit in the load's window: per stage, the mean rows of a group and the mean
    time of its write (stocksvr_try_group_size, stocksvr_try_group_write_seconds), and the
    commit group's transaction in its parts (stocksvr_try_group_part_seconds: the connection,
    the CAS UPDATE, the outbox INSERT, the COMMIT with its log flush): what a Try waited on."""
    stages = []
    for stage in ("insert", "lua", "begin", "commit"):
        n, rows = pipeline.histogram_mean(m0, m1, "stocksvr_try_group_size", {"stage": stage})
        _, write = pipeline.histogram_mean(m0, m1, "stocksvr_try_group_write_seconds", {"stage": stage})
        if n and write is not None:
            stages.append(f"{stage} {rows:.1f} rows in {write * 1000:.2f} ms")
    parts = []
    for part in pipeline.GROUP_PARTS:
        n, took = pipeline.histogram_mean(m0, m1, "stocksvr_try_group_part_seconds", {"part": part})
        if n:
            parts.append(f"{part} {took * 1000:.2f}")
    return ("group commit, mean group and write: " + (", ".join(stages) if stages else "no groups")
            + (f" (commit's parts, ms: {', '.join(parts)})" if parts else ""))


def start_all(b, init):
    """`stocksvr all` on the run's namespace with its metrics watched; `init`: the buckets are
    made here through the admin API (no part 1 ran)."""
    b.all = b.role("all", 88)
    if init:
        b.log(f"{init_buckets(b, b.all.url(''))} buckets initialised through POST /admin/buckets")
    b.watch = MetricsWatch(b.all)
    b.watch.start()


def part_http(b, init=False):
    """Trys through HTTP against `stocksvr all`: hot dish, cold dishes, order-level, and the
    concurrency sweep on the hot dish. `init`: the buckets are made here (no part 1 ran)."""
    start_all(b, init)
    P = b.P
    # Every measured load starts with the outbox sent and the projector caught up: otherwise
    # it would pay for the relay and the projector working off the load before it (the
    # capture's events wait in the outbox until this process starts), and the projection
    # delay would be that backlog's age.
    quiet(b)
    b.log(f"warm-up: hot dish, 64 connections, {P['warm_secs']} s")
    wrk_load(b, b.all, "warm-up", "single", 64, P["warm_secs"], HOT_DISH, 1)
    quiet(b)
    b.log(f"Try through HTTP, hot dish, 64 connections, {P['try_secs']} s")
    hot = wrk_load(b, b.all, "try-hot-64", "single", 64, P["try_secs"], HOT_DISH, 1)
    b.fig.add("try_http_hot", "Try through HTTP, hot dish, 64 conn (stocksvr all)", hot["rate"],
              p50_ms=hot["p50_ms"], p99_ms=hot["p99_ms"], concurrency=64, note=hot["note"])
    b.fig.add("stmts_per_try", "MariaDB statements per Try (hot, 64 conn, stocksvr all)",
              hot["stmts_per_try"], "stmt/Try",
              note=f"Questions delta / 2xx Trys; {hot['lua_per_try']:.2f} Lua calls/Try")
    b.fig.add("backlog_during_try", "outbox backlog during the hot Try load (max)", hot.get("backlog_max"),
              "rows", note=f"oldest pending row at most {hot.get('oldest_max')} s (stocksvr_outbox_* gauges)")
    b.fig.add("projection_delay_try", "projection delay p99 during the hot Try load",
              None if hot["delay_p99"] is None else hot["delay_p99"] * 1000, "ms",
              note=f"stocksvr_projection_delay_seconds, {hot['delay_n']:.0f} events, bucket interpolation; "
                   + ("over 100 ms: " + (f"{hot['delay_over_100ms'] * 100:.1f}%"
                                         if hot.get("delay_over_100ms") is not None else "unknown")))
    _rows_figure(b, "rows_per_try_hot", "MariaDB rows changed per Try, hot dish (every table, whole pipeline)", hot)
    quiet(b)
    b.log(f"Try through HTTP, {P['cold_dishes']} cold dishes, 64 connections, {P['try_secs']} s")
    cold = wrk_load(b, b.all, "try-cold-64", "single", 64, P["try_secs"], COLD_BASE, P["cold_dishes"])
    b.fig.add("try_http_cold", f"Try through HTTP, {P['cold_dishes']:,} cold dishes, 64 conn", cold["rate"],
              p50_ms=cold["p50_ms"], p99_ms=cold["p99_ms"], concurrency=64, note=cold["note"])
    _rows_figure(b, "rows_per_try_cold", "MariaDB rows changed per Try, cold dishes (every table, whole pipeline)",
                 cold)
    quiet(b)
    b.log(f"order-level Try of 3 dishes, 64 connections, {P['try_secs']} s")
    order = wrk_load(b, b.all, "try-order-64", "order", 64, P["try_secs"], ORDER_DISH, 3)
    b.fig.add("try_http_order", "order-level Try of 3 dishes, 64 conn (orders)", order["rate"],
              p50_ms=order["p50_ms"], p99_ms=order["p99_ms"], concurrency=64,
              note=f"{order['rate'] * 3:,.0f} items/s; " + order["note"])
    sweep = []
    for c in P["sweep"]:
        if c == 64:
            res = hot
        else:
            quiet(b)
            b.log(f"sweep: hot dish, {c} connections, {P['sweep_secs']} s")
            res = wrk_load(b, b.all, f"try-hot-c{c}", "single", c, P["sweep_secs"], HOT_DISH, 1)
        b.fig.add(f"try_http_hot_c{c}", f"Try through HTTP, hot dish, {c} conn", res["rate"],
                  p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=c,
                  note="" if c == 64 else res["note"])
        sweep.append((c, res["rate"], res["p99_ms"]))
    b.raw["sweep"] = sweep


def part_ab(b, against, against_env, rounds):
    """The hot-dish Try at 64 connections of two `stocksvr all`s in one run, alternated round
    by round (A B, B A, A B, ...): A is --bin with --set, B is `against` (a binary, or --bin)
    with the extra settings `against_env`. Run to run the hot Try moves by about ±10% on a
    shared 2-core machine, more than most changes to the Try path, so a before/after needs
    both sides in the same minutes; each round's B/A pairs the two loads closest in time.
    Every load starts from a drained outbox and a caught-up projector, as the other parts'."""
    P = b.P
    sides = {"A": (None, {}), "B": (against, against_env)}
    got = {"A": [], "B": []}
    for rnd in range(1, rounds + 1):
        for side in ("A", "B") if rnd % 2 else ("B", "A"):
            binary, env = sides[side]
            b.all = b.role("all", 88, binary=binary, **env)
            if not got["A"] and not got["B"]:  # the first side of the run
                b.log(f"{init_buckets(b, b.all.url(''))} buckets initialised through POST /admin/buckets")
            b.watch = MetricsWatch(b.all)
            b.watch.start()
            quiet(b)
            wrk_load(b, b.all, "warm-up", "single", 64, P["warm_secs"], HOT_DISH, 1)
            quiet(b)
            b.log(f"round {rnd}/{rounds}, {side}: hot dish, 64 connections, {P['try_secs']} s")
            got[side].append(wrk_load(b, b.all, f"ab-{side}{rnd}", "single", 64, P["try_secs"], HOT_DISH, 1))
            # Trys that wrk's end cut off (their client gone mid-request) stay PREPARING until
            # this process's recovery worker finishes them, about 10 s on: wait for it, so the
            # next side neither inherits them nor leaves them for a check no worker serves.
            left = checks.wait_settled(b.db, b.merchant, 60)
            if left:
                b.notes.append(f"ab-{side}{rnd}: {left} reservations still intermediate 60 s after the load")
            quiet(b)  # the next side starts with nothing of this one's left to publish or book
            b.watch.stop()
            b.watch = None
            b.stop_role(b.all)
            b.all = None

    def median(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    for side in ("A", "B"):
        runs = got[side]
        what = b.a.bin if side == "A" else (against or b.a.bin)
        settings = ", ".join(b.a.against_set) if side == "B" else ""
        b.fig.add(f"ab_{side}", f"{side}: hot Try, 64 conn, median of {rounds}", median([r["rate"] for r in runs]),
                  p50_ms=median([r["p50_ms"] for r in runs]), p99_ms=median([r["p99_ms"] for r in runs]),
                  concurrency=64,
                  note=f"{what}{' with ' + settings if settings else ''}; rounds "
                       + " / ".join(f"{r['rate']:,.0f}" for r in runs) + " per s, p99 "
                       + " / ".join(f"{r['p99_ms']:.1f}" for r in runs) + " ms")
    paired = [bb["rate"] / aa["rate"] for aa, bb in zip(got["A"], got["B"], strict=False) if aa["rate"]]
    b.fig.ratio_value("ratio_ab", "B / A, hot Try (median of the rounds' ratios)", median(paired),
                      "rounds " + " / ".join(f"{x:.2f}" for x in paired))


def quiet(b):
    """wait_quiet before a measured load; a stocksvr all that exited meanwhile is restarted
    and warmed up again, so the load does not measure a cold process."""
    for _ in range(3):
        took = wait_quiet(b)
        if took >= 1:
            b.log(f"  (waited {took:.0f} s for the outbox and the projector to catch up)")
        if not b.revived:
            return
        b.revived = False
        wrk_load(b, b.all, "warm-up", "single", 64, b.P["warm_secs"], HOT_DISH, 1)


def wait_quiet(b, timeout=300, orders=False):
    """Waits until the outbox is empty and the projector group has booked every stock-change
    event (so the next part starts from a clean state); with orders, also until the
    order-lifecycle group has handled every order event. Returns the seconds it took."""
    t0 = time.time()
    topic = f"{b.ns}.inventory.stock-change.v1"
    group = f"{b.group_prefix}.projector"
    seen = {}

    def quiet_now():
        if b.all is not None:
            b.revive(b.all, "while the bench waited for the outbox and the projector")
        seen["pending"] = pending = b.db.one(f"SELECT COUNT(*) {codes.OUTBOX_UNSENT_FROM}")
        lag = kafka.group_lag(b.a.brokers, group, topic) if pending == 0 else None
        if orders and lag == 0:
            lag = kafka.group_lag(b.a.brokers, f"{b.group_prefix}.order-lifecycle", f"{b.ns}.order.lifecycle.v1")
        seen["lag"] = lag
        return pending == 0 and lag == 0

    try:
        wait_until(quiet_now, timeout, "the outbox to empty and the projector to catch up", interval=1.0)
    except WaitTimeout as e:
        raise BenchError(f"outbox/projector not quiet after {timeout}s (pending {seen.get('pending')}, "
                         f"lag {seen.get('lag')})") from e
    return time.time() - t0
