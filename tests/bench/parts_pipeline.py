"""The pipeline parts of a bench run: a backlog made by Trys while no relay runs, drained by
`stocksvr outbox-relay` alone and booked by `stocksvr projector` alone, next to Kafka's own
tools; a fresh group catching up (resident memory after a large backlog); OrderCreated ->
CONFIRMED at a steady rate; the idle cost; the durability check."""

import os
import subprocess
import threading
import time

import redis

import checks
import loads
import pipeline
from bench import COLD_BASE, REPO, MetricsWatch, settings_env
from parts import wait_quiet, wrk_load
from stocksvr_harness import codes, kafka
from stocksvr_harness.wait import WaitTimeout, wait_until
from system import CLK_TCK, BenchError, StatusSampler, http, metric_sum, read_proc


def _count_pending(b, topic=None, records=False):
    """Outbox rows not sent yet (of one topic: its logical name, as the rows keep it);
    `records`: the Kafka records they become instead (a reservation step's row, the one with an
    Avro body or, written by earlier versions, a `lifecycle` member in its JSON payload, goes
    out as its stock change and its lifecycle event)."""
    what = ("COUNT(*) + COALESCE(SUM(o.body IS NOT NULL OR JSON_EXISTS(o.payload, '$.lifecycle')), 0)"
            if records else "COUNT(*)")
    sql = f"SELECT {what} {codes.OUTBOX_UNSENT_FROM}"
    args = []
    if topic:
        sql += " AND o.topic = %s"
        args.append(topic)
    return b.db.one(sql, args)


def part_pipeline(b):
    P = b.P
    stock_topic = f"{b.ns}.inventory.stock-change.v1"
    b.log("waiting for stocksvr all to publish and book everything")
    wait_quiet(b)
    b.watch.stop()
    b.watch = None
    b.stop_role(b.all)
    b.all = None

    trys = P["backlog_trys"]
    b.log(f"backlog: {trys:,} Trys on {P['cold_dishes']} cold dishes through stocksvr order-lifecycle "
          "alone (no relay)")
    api = b.role("order-lifecycle", 88)
    # Each of wrk's two threads stops sending after its half; wrk itself is stopped once every
    # Try is in the database (or nothing has moved for 10 s). The duration only bounds a stuck
    # run (at least 50 Trys a second).
    count_sql = "SELECT COUNT(*) FROM inventory_reservation WHERE merchant_id = %s"
    target = b.db.one(count_sql, (b.merchant,)) + 2 * ((trys + 1) // 2)
    seen = {"n": -1, "t": time.time()}

    def all_in():
        n = b.db.one(count_sql, (b.merchant,))
        if n != seen["n"]:
            seen.update(n=n, t=time.time())
        return n >= target or time.time() - seen["t"] > 10

    res = wrk_load(b, api, "backlog-trys", "single", 64, max(120, trys // 50), COLD_BASE, P["cold_dishes"],
               quota=(trys + 1) // 2, stop_when=all_in)
    b.fig.add("try_http_api_alone", "Try through HTTP, cold dishes, 64 conn, API process alone", res["rate"],
              p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=64,
              note="stocksvr order-lifecycle; " + res["note"])
    b.stop_role(api)
    n_rows = _count_pending(b)
    n_relay = _count_pending(b, records=True)
    n_proj = _count_pending(b, "inventory.stock-change.v1")
    b.log(f"outbox backlog: {n_rows:,} rows, {n_relay:,} records ({n_proj:,} for {stock_topic})")

    with b.phase("relay-drain") as rec:
        t_start = time.time()
        relay = b.role("outbox-relay", 89)
        ft, fv, lt, lv = pipeline.wait_counter(relay, "stocksvr_outbox_published_total", n_relay, 1800)
        rec["rss_after_mb"] = b.sampler.sample()[1].get("stocksvr outbox-relay", (0, 0))[1] / 1024
    left = _count_pending(b)
    relay_rate = pipeline.drain_rate(ft, fv, lt, lv)
    bound = ""
    if relay_rate is None and lt > t_start:
        # The whole backlog went out between two polls (a quick run's few thousand events):
        # only a lower bound is known, counted from the process start.
        relay_rate = n_relay / (lt - t_start)
        bound = "at least (drained between two 0.1 s polls; rate from process start); "
    b.fig.add("relay", f"outbox relay alone, publishing {n_relay:,} records of {n_rows:,} rows", relay_rate,
              note=f"{bound}{lt - t_start:.1f} s from process start; pending left {left}; "
                   f"RSS {rec['rss_after_mb']:.0f} MB")
    b.stop_role(relay)
    if left:
        b.notes.append(f"{left} outbox rows still not sent after the relay's published counter reached the backlog")

    sizes = {}
    for logical in ("inventory.stock-change.v1", "inventory.lifecycle.v1"):
        topic = f"{b.ns}.{logical}"
        sizes[topic] = pipeline.topic_sizes(b.a.brokers, topic, 2000, f"{b.ns}.sizes")
    size = round(sum(c * s for c, s in sizes.values()) / max(1, sum(c for c, _ in sizes.values())))
    perf_topic = f"{b.ns}.perf-producer"
    kafka.create_topic(b.a.brokers, perf_topic, 6)
    klog = os.path.join(b.logs, "kafka-tools.log")
    b.log(f"Kafka's producer tool: {n_relay:,} records of {size} bytes, acks=all, idempotent")
    with b.phase("kafka-producer-tool") as rec:
        kp = loads.kafka_producer_perf(b.a.kafka_home, b.a.log4j, b.a.brokers, perf_topic, n_relay, size, klog)
        rec["gen_cpu_pct"] = kp["gen_cpu_pct"]
    b.fig.add("kafka_producer", f"Kafka producer perf tool, {n_relay:,} records of {size} B", kp["rate"],
              p50_ms=kp["p50_ms"], p99_ms=kp["p99_ms"], note="kafka-producer-perf-test (ProducerPerformance)")

    ledger0 = b.db.one("SELECT COUNT(*) FROM inventory_ledger")
    b.log(f"projector alone booking {n_proj:,} events")
    with b.phase("projector-book") as rec:
        t_start = time.time()
        proj = b.role("projector", 90)
        ft, fv, lt, lv = pipeline.wait_counter(proj, "stocksvr_projector_events_projected_total", n_proj, 1800)
        rec["rss_after_mb"] = b.sampler.sample()[1].get("stocksvr projector", (0, 0))[1] / 1024
    booked = b.db.one("SELECT COUNT(*) FROM inventory_ledger") - ledger0
    b.fig.add("projector", f"projector alone, booking {n_proj:,} events", pipeline.drain_rate(ft, fv, lt, lv),
              note=f"{lt - t_start:.1f} s from process start; {booked:,} ledger rows; RSS {rec['rss_after_mb']:.0f} MB")
    b.stop_role(proj)
    b.log(f"Kafka's consumer tool on {stock_topic}: {n_proj:,} records")
    with b.phase("kafka-consumer-tool") as rec:
        kc = loads.kafka_consumer_perf(b.a.kafka_home, b.a.log4j, b.a.brokers, stock_topic, n_proj,
                                       f"{b.ns}.perf-consumer", klog)
        rec["gen_cpu_pct"] = kc["gen_cpu_pct"]
    b.fig.add("kafka_consumer", f"Kafka consumer perf tool, {kc['records']:,} records of the same topic",
              kc["rate"], note=f"fetch rate; {kc['overall_rate']:,.0f}/s with the group join")
    b.raw.update(relay_sizes=sizes, kafka_producer=kp, kafka_consumer=kc)

    # A fresh group on every topic: the case where RSS used to stay at 200 MB.
    records, _ = pipeline.topic_sizes(b.a.brokers, stock_topic, 0, f"{b.ns}.sizes")
    b.group_prefix = f"{b.ns}.fresh"
    b.log(f"stocksvr all with a fresh group prefix catching up on {records:,} stock-change events")
    with b.phase("fresh-group-catch-up") as rec:
        t_start = time.time()
        r = b.role("all", 88, STOCKSVR__KAFKA__GROUP_PREFIX=b.group_prefix)
        b.all = r
        seen = {}

        def caught_up():
            if r.proc.poll() is not None:
                raise BenchError(f"the fresh group did not catch up: stocksvr all exited (lag {seen.get('lag')}; "
                                 f"log {r.log})")
            seen["lag"] = kafka.group_lag(b.a.brokers, f"{b.group_prefix}.projector", stock_topic)
            return seen["lag"] == 0

        try:
            wait_until(caught_up, 1800, "the fresh group to catch up")
        except WaitTimeout as e:
            raise BenchError(f"the fresh group did not catch up (lag {seen.get('lag')}; log {r.log})") from e
    took = rec["t1"] - t_start
    rss = b.sampler.window(rec["t0"], rec["t1"])["procs"].get("stocksvr all", {})
    b.fig.add("catch_up", f"stocksvr all, fresh group catching up on {records:,} events", records / took,
              note=f"{took:.1f} s from process start")
    b.fig.add("rss_after_backlog", "RSS of stocksvr all right after catching up", rss.get("rss_last_mb"), "MB",
              note=f"max during the catch-up {rss.get('rss_max_mb', 0):.0f} MB")
    b.watch = MetricsWatch(r)
    b.watch.start()


def part_orders(b):
    """OrderCreated -> CONFIRMED at a steady rate from the Python Confluent producer: once on
    a quiet service, once more while stocksvr all checks the bench merchant's buckets in full."""
    rate, secs, check_secs = b.P["order_rate"], b.P["order_secs"], b.P["check_order_secs"]
    n, n_check = rate * secs, rate * check_secs
    n_warm = rate * b.P["warm_secs"]
    rows = b.db.q("SELECT id, order_id FROM inventory_reservation WHERE merchant_id = %s AND status = %s "
                  "AND dish_id >= %s ORDER BY id LIMIT %s",
                  (b.merchant, codes.RESERVED, COLD_BASE, n_warm + n + n_check))
    if len(rows) < n_warm + n:
        raise BenchError(f"only {len(rows)} RESERVED cold-dish reservations for {n_warm} + {n} orders")
    orders = [(int(o), int(i)) for i, o in rows]
    warm, orders, during = orders[:n_warm], orders[n_warm:n_warm + n], orders[n_warm + n:]
    producer = pipeline.OrderProducer(b.a.brokers, b.a.registry, f"{b.ns}.order.lifecycle.v1")
    producer.warm_up(b.merchant)
    # The flow itself is warmed up too, as the Try loads are: on a Kafka started minutes
    # before, the first seconds of orders ran with Kafka at 66-81% of a core against 33-41%
    # later, its C2 compiler thread busy (JFR: about 18% of a core over those seconds), and
    # a second run right after had no such seconds. A running service's Kafka is warm; its
    # figure is printed apart, so nothing is hidden.
    # The reconciler's first full check after the start of stocksvr all reads every held
    # reservation's fence and op record (paced; about 2,000 a second here), and a fresh
    # database has never been checked in full. It used to overlap the orders by chance (9 of
    # 17 `--only pipeline` runs on 2026-12-06), so the quiet orders are measured after it,
    # and the orders beside a full check are a round of their own below (a running service
    # checks each bucket in full every reconcile.full_check_secs).
    full = _wait_full_check(b)
    if full is not None:
        b.notes.append(f"the orders started after the reconciler's full check: {full[0]:,.0f} fences "
                       f"and op records read in {full[1]:.0f} s")
    b.log(f"warm-up: OrderCreated at {rate}/s for {b.P['warm_secs']} s ({n_warm:,} orders, not measured)")
    w_sent, _ = producer.run(warm, b.merchant, rate)
    w_lat, _, w_confirmed, _, _ = pipeline.confirm_latencies(b.db, w_sent, dict(warm), 120)
    b.warm_orders = (w_confirmed, len(warm), pipeline.pct(w_lat, 99))
    settled = settle(b)
    b.log(f"OrderCreated at {rate}/s for {secs} s ({n:,} orders) from the Python Confluent producer")
    got = _orders_round(b, producer, orders, "orders")
    lat, proj, confirm_rate = got["lat"], got["proj"], got["confirm_rate"]
    age, batch = got["age"], got["batch"]
    b.fig.add("order_confirm", f"OrderCreated -> CONFIRMED at {rate}/s ({n:,} orders)", confirm_rate,
              p50_ms=_ms(pipeline.pct(lat, 50)), p99_ms=_ms(pipeline.pct(lat, 99)),
              note=f"produce -> CONFIRMED updated_at; {got['confirmed']:,} confirmed, "
                   f"its parts, p50 / p99: record age on arrival {_ms(age[0]) or 0:.1f} / {_ms(age[1]) or 0:.1f} ms "
                   f"(the producer, Kafka, and the wait behind the batch before), batch settled in "
                   f"{_ms(batch[0]) or 0:.1f} / {_ms(batch[1]) or 0:.1f} ms (histograms of order-lifecycle, "
                   f"buckets 10/25/50/75/100 ms); "
                   f"{confirm_rate or 0:,.0f} confirms/s from the first produce to the last confirm; "
                   f"produced at {n / got['took']:,.0f}/s; started {settled:.0f} s after a warm-up of "
                   f"{b.warm_orders[1]:,} orders at the same rate (p99 {_ms(b.warm_orders[2]) or 0:.0f} ms, "
                   f"{b.warm_orders[0]:,} confirmed) had settled (Kafka and MariaDB under 25% of a core)")
    rec = got["rec"]
    m0, m1 = got["m"]
    hq, hn = pipeline.histogram_quantile(m0, m1, "stocksvr_projection_delay_seconds", 0.99)
    over = pipeline.histogram_share_over(m0, m1, "stocksvr_projection_delay_seconds", 0.1)
    backlog, _oldest = b.watch.max_between(rec["t0"], rec["t1"])
    b.fig.add("projection_delay", f"projection delay under {rate} orders/s", _ms(pipeline.pct(proj, 99)), "ms",
              p50_ms=_ms(pipeline.pct(proj, 50)), p99_ms=_ms(pipeline.pct(proj, 99)),
              note=f"CONFIRMED -> its ledger row; histogram p99 {_ms(hq) or 0:.0f} ms over {hn:.0f} events"
                   + (f" ({over * 100:.1f}% over 100 ms)" if over is not None else "") + "; "
                   f"outbox backlog max {backlog}")
    if len(during) < n_check:
        b.notes.append(f"no orders beside a full check: {len(during):,} RESERVED cold-dish reservations "
                       f"left for {n_check:,}")
    else:
        _orders_beside_full_check(b, producer, during)
    rss = [(p["usage"]["procs"].get("stocksvr all", {}).get("rss_max_mb", 0), p["name"]) for p in b.phases]
    top, where = max(rss)
    b.fig.add("rss_max", "RSS of stocksvr all, highest sample of the run", top, "MB",
              note=f"in phase {where}; during these orders "
                   f"{rec['usage']['procs'].get('stocksvr all', {}).get('rss_max_mb', 0):.0f} MB; VmRSS every second")


def _setting(b, key):
    """A setting as the run's stocksvr processes got it (the bench's own and --set), or
    "default"."""
    return b.env.get(next(iter(settings_env([key + "=x"]))), "default")


def _orders_round(b, producer, orders, name):
    """Produces `orders` at the order rate and waits for their CONFIRMED rows, as phase
    `name`; notes the seconds that held orders slower than 100 ms, with what the machine did
    in them. Returns the latencies and the order-lifecycle histograms' parts."""
    rate = b.P["order_rate"]
    n = len(orders)
    wait = n // rate + 240
    m0 = b.all.metrics()
    status = StatusSampler(b.stack.db(), redis.Redis(host="127.0.0.1", port=b.stack.redis_port))
    status.start()
    with b.phase(name, tables=True) as rec:
        sent, took = producer.run(orders, b.merchant, rate)
        # The wait is bounded: when stocksvr confirms slower than the orders come, the rest
        # is confirmed in the background (part_idle waits for it) and the latencies are
        # those of the orders confirmed in time (the slowest are missing).
        lat, proj, confirmed, confirm_rate, timed = pipeline.confirm_latencies(
            b.db, sent, dict(orders), wait)
    status.stop()
    m1 = b.all.metrics()
    slow = pipeline.slow_seconds(timed, 0.1)
    b.raw[f"{name}_slow_seconds"] = slow
    acks = _ack_delays(producer, sent, timed)
    b.notes.append(f"{name}: produce -> Kafka's ack (acks=all) p50 / p99 {_ms(acks['all'][0]) or 0:.1f} / "
                   f"{_ms(acks['all'][1]) or 0:.1f} ms over {len(producer.acked):,} acks")
    if slow:
        b.notes.append(f"{name}: orders slower than 100 ms came in these seconds of the run (second: slow/all, max; "
                       "produce -> ack p99 that second): " +
                       ", ".join(f"{sec}: {k}/{n}, {mx * 1000:.0f} ms; ack {_ms(acks.get(sec, (0, 0))[1]) or 0:.0f} ms"
                                 for sec, n, k, mx in slow))
        # What the machine did in those seconds, next to the run's other seconds: a stall
        # shows as CPU moving to one process, or as page flushing, fsyncs or lock waits.
        t0 = min(t for t, _ in timed)
        seconds = sorted({sec for sec, *_ in slow})
        rest = [s for s in range(int(took)) if s not in seconds]
        b.raw[f"{name}_seconds"] = {s: _second(b, status, t0 + s) for s in range(int(took) + 1)}
        for s in seconds:
            b.notes.append(f"{name}, second {s}: {_second_line(b.raw[f'{name}_seconds'][s])}")
        b.notes.append(f"{name}, a median other second: " + _second_line(_median_second(
            [b.raw[f"{name}_seconds"][s] for s in rest])))
    if confirmed < n:
        b.notes.append(f"{name}: only {confirmed:,} of {n:,} orders CONFIRMED within {wait} s of the first; "
                       "their latencies exclude the slowest")
    # The two halves of an order's delay inside the flow: how old each OrderCreated was when
    # the order-lifecycle processor received it (the producer, the broker, the fetch), and
    # how long its batch took to settle (the Confirm in Redis and MySQL).
    lifecycle = {"processor": "order-lifecycle"}
    age, batch = ([pipeline.histogram_quantile(m0, m1, name_, q, lifecycle)[0] for q in (0.5, 0.99)]
                  for name_ in ("stocksvr_consumer_record_age_seconds", "stocksvr_processing_seconds"))
    b.notes.append(f"{name}: where a batch waited, p50 / p99 in ms: " + _batch_parts(m0, m1))
    tables = b.table_line(rec, confirmed, "order")
    if tables:
        b.notes.append(f"{name}: {tables}")
    if name == "orders" and b.rows_changed(rec, confirmed) is not None:
        b.fig.add("rows_per_order", "MariaDB rows changed per confirmed order (every table, whole pipeline)",
                  b.rows_changed(rec, confirmed), "rows/order",
                  note="information_schema.table_statistics rows_changed delta / orders CONFIRMED; "
                       "issue 48 target <= 4")
    return {"lat": lat, "proj": proj, "confirmed": confirmed, "confirm_rate": confirm_rate, "took": took,
            "rec": rec, "m": (m0, m1), "age": age, "batch": batch}


def _ack_delays(producer, sent, timed):
    """Produce -> broker ack, p50 / p99: over the round ("all") and by second of the round
    (counted as slow_seconds counts them, from the first confirmed order's produce)."""
    delays = {o: producer.acked[o] - t for o, t in sent.items() if o in producer.acked}
    out = {"all": (pipeline.pct(list(delays.values()), 50), pipeline.pct(list(delays.values()), 99))}
    if timed:
        t0 = min(t for t, _ in timed)
        by = {}
        for o, d in delays.items():
            by.setdefault(int(sent[o] - t0), []).append(d)
        out.update({sec: (pipeline.pct(ds, 50), pipeline.pct(ds, 99)) for sec, ds in by.items()})
    return out


def _batch_parts(m0, m1):
    """The order-lifecycle batch's time in its steps over the round: the Confirm operation as
    a whole, and the group-commit stages it queues on (the CAS into CONFIRMING, the
    completion's transaction and that transaction's parts). A slow batch shows which one
    held it."""
    def p50_p99(name, match):
        q = [pipeline.histogram_quantile(m0, m1, name, x, match) for x in (0.5, 0.99)]
        return f"{_ms(q[0][0]) or 0:.1f} / {_ms(q[1][0]) or 0:.1f} ({q[1][1]:,.0f})" if q[1][1] else None

    steps = [(label, p50_p99(name, match)) for label, name, match in (
        ("confirm", "stocksvr_reservation_operation_seconds", {"operation": "confirm"}),
        ("begin group", "stocksvr_try_group_write_seconds", {"stage": "begin"}),
        ("commit group", "stocksvr_try_group_write_seconds", {"stage": "commit"}))]
    parts = [(part, p50_p99("stocksvr_try_group_part_seconds", {"part": part})) for part in pipeline.GROUP_PARTS]
    text = ", ".join(f"{label} {q}" for label, q in steps if q) or "no Confirm observed"
    parts_text = ", ".join(f"{part} {q}" for part, q in parts if q)
    return text + (f" (commit's parts: {parts_text})" if parts_text else "")


def _orders_beside_full_check(b, producer, orders):
    """The orders again while stocksvr all checks every bucket of the bench merchant in full:
    GET /admin/reconcile runs the on-demand check inside stocksvr all, with the reads and
    the pacing (reconcile.guard_reads_per_sec) of the scheduled full check that a running
    service makes of each bucket every reconcile.full_check_secs. It reads faster than the
    scheduled one, which goes shard by shard (about 5,000 a second against 2,000 at the
    default pacing of 10,000), so it is the harder case of the two."""
    rate = b.P["order_rate"]
    name = "stocksvr_reconcile_guards_read_total"
    answer = {}

    def check():
        answer["at"] = time.time()
        answer["reply"] = http("GET", b.all.url(f"/admin/reconcile?merchant_id={b.merchant}"),
                               headers={"authorization": f"Bearer {b.token}"}, timeout=1800)
        answer["took"] = time.time() - answer["at"]

    g0 = metric_sum(b.all.metrics(), name)
    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    # The check sums each chunk of buckets in MySQL before it reads their guards: the
    # orders start once the guards are being read.
    t0 = time.time()
    try:
        wait_until(lambda: metric_sum(b.all.metrics(), name) != g0 or not checker.is_alive(), 60,
                   "the full check to read its first guards", interval=0.2)
    except WaitTimeout:
        pass  # noted below
    if not checker.is_alive() or metric_sum(b.all.metrics(), name) == g0:
        checker.join(5)
        b.notes.append(f"no orders beside a full check: the check read no guards within "
                       f"{time.time() - t0:.0f} s (reply {str(answer.get('reply'))[:200]})")
        return
    settle_wait = time.time() - t0
    b.log(f"OrderCreated at {rate}/s for {len(orders) // rate} s ({len(orders):,} orders) while stocksvr all "
          f"checks the bench merchant's buckets in full (GET /admin/reconcile)")
    g1 = metric_sum(b.all.metrics(), name)
    got = _orders_round(b, producer, orders, "orders-full-check")
    g2 = metric_sum(b.all.metrics(), name)
    still = checker.is_alive()
    b.log(f"  waiting for the check to end ({g2 - g0:,.0f} guards read so far)")
    checker.join(1800)
    status, text = answer.get("reply", (None, ""))
    if status != 200:
        raise BenchError(f"GET /admin/reconcile answered {status}: {text[:300]}")
    rec, lat, age, batch = got["rec"], got["lat"], got["age"], got["batch"]
    during = rec["t1"] - rec["t0"]
    b.fig.add("order_confirm_check", f"OrderCreated -> CONFIRMED at {rate}/s beside a full check", got["confirm_rate"],
              p50_ms=_ms(pipeline.pct(lat, 50)), p99_ms=_ms(pipeline.pct(lat, 99)),
              note=f"{got['confirmed']:,} of {len(orders):,} confirmed; the check read {g2 - g1:,.0f} fences and "
                   f"op records in the orders' {during:.0f} s ({(g2 - g1) / during:,.0f}/s; "
                   f"reconcile.guard_reads_per_sec {_setting(b, 'reconcile.guard_reads_per_sec')}), "
                   + ("and was still reading when they ended" if still else "and ended before them")
                   + f"; it read its first guards {settle_wait:.1f} s after its start and took {answer['took']:.0f} s "
                   f"in all ({metric_sum(b.all.metrics(), name) - g0:,.0f} read); parts p50 / p99: record age "
                   f"{_ms(age[0]) or 0:.1f} / {_ms(age[1]) or 0:.1f} ms, batch settled "
                   f"{_ms(batch[0]) or 0:.1f} / {_ms(batch[1]) or 0:.1f} ms")


def settle(b, busy_pct=25.0, timeout=60.0):
    """Waits until Kafka and MariaDB are no longer busy with the part before (the fresh group's
    catch-up can leave them working after its lag reads 0: page flushing, purge, offset
    commits), so the orders measure a steady rate, not that part's tail. Returns the seconds
    waited (at least the one-second sample; 1 to 5 s in the runs of 2026-12-03)."""
    t0 = time.time()

    def calm():
        now = time.time()
        procs = b.sampler.window(now - 1.0, now)["procs"]
        return max((procs.get(n, {}).get("cpu_pct") or 0) for n in ("kafka", "mariadbd")) < busy_pct

    # Each look is the sampler's last second, so the first comes a second after the start
    # (an earlier one would see the part before).
    time.sleep(1.0)
    try:
        wait_until(calm, timeout - 1.0, f"Kafka and MariaDB below {busy_pct:.0f}% CPU", interval=1.0)
    except WaitTimeout:
        pass  # the orders then run beside the tail: the phase line shows its CPU
    return time.time() - t0


def _second(b, status, t):
    """CPU per process (% of a core) and MariaDB counters per second in [t, t+1]."""
    procs = {n: v["cpu_pct"] for n, v in b.sampler.window(t, t + 1)["procs"].items() if v["cpu_pct"] is not None}
    return {"cpu": procs, "mysql": status.second(t) or {}}


def _median_second(rows):
    def med(values):
        values = sorted(values)
        return values[len(values) // 2] if values else 0
    names = set().union(*(r["cpu"].keys() for r in rows)) if rows else set()
    keys = set().union(*(r["mysql"].keys() for r in rows)) if rows else set()
    return {"cpu": {n: med([r["cpu"].get(n, 0) for r in rows]) for n in names},
            "mysql": {k: med([r["mysql"].get(k, 0) for r in rows if r["mysql"]]) for k in keys}}


def _second_line(s):
    cpu = ", ".join(f"{n} {v:.0f}%" for n, v in sorted(s["cpu"].items(), key=lambda kv: -kv[1]) if v >= 1)
    m = s["mysql"]
    if not m:
        return cpu + " | no MariaDB sample"
    return (f"{cpu} | MariaDB {m['Questions']:,.0f} stmt/s, {m['Com_commit']:,.0f} commits/s, "
            f"{m['Innodb_os_log_fsyncs']:,.0f} log fsyncs/s, {m['Innodb_data_fsyncs']:,.0f} data fsyncs/s, "
            f"{m['Innodb_buffer_pool_pages_flushed']:,.0f} pages flushed/s, "
            f"dirty {m['Innodb_buffer_pool_pages_dirty']:,}, "
            f"checkpoint age {m['Innodb_checkpoint_age'] / 1e6:,.0f} MB, history {m['Innodb_history_list_length']:,}, "
            f"row lock waits {m['Innodb_row_lock_waits']:,.0f}/s ({m['Innodb_row_lock_time']:,.0f} ms/s), "
            f"threads running {m['Threads_running']}" + _redis_part(m))


def _redis_part(m):
    if "redis:commands" not in m:
        return ""
    calls = sorted(((k[len("redis:"):], v) for k, v in m.items() if k.startswith("redis:")
                    and k not in ("redis:commands", "redis:forks", "redis:aof_delayed_fsync",
                                  "redis:aof_rewrite_in_progress") and v >= 0.5), key=lambda e: -e[1])
    return (f" | Redis {m['redis:commands']:,.0f} cmd/s ("
            + ", ".join(f"{k} {v:,.0f}" for k, v in calls[:4]) + f"), forks {m['redis:forks']:.0f}, "
            f"AOF rewrite {'running' if m.get('redis:aof_rewrite_in_progress') else 'no'}, "
            f"delayed AOF fsyncs {m['redis:aof_delayed_fsync']:.0f}")


def _ms(s):
    return None if s is None else s * 1000.0


def part_idle(b):
    b.log("waiting for the pipeline to go quiet (orders confirmed too), then measuring idle")
    wait_quiet(b, timeout=900, orders=True)
    # The bench's own scrape of /metrics every second stops first, so the window holds the
    # process's own work only; what a scrape costs is measured after the window.
    if b.watch is not None:
        b.watch.stop()
        b.watch.join(timeout=5)
    full = _wait_full_check(b)
    secs = b.P["idle_secs"]
    t0 = _thread_ticks(b.all.pid)
    with b.phase("idle") as rec:
        time.sleep(secs)
    threads = _thread_ticks(b.all.pid)
    u = rec["usage"]["procs"].get("stocksvr all", {})
    took = rec["t1"] - rec["t0"]
    scrape = _scrape_cost(b)
    b.fig.add("idle_cpu", f"idle CPU of stocksvr all over {secs} s", u.get("cpu_pct"), "% core",
              note=f"RSS {u.get('rss_last_mb', 0):.0f} MB; no scrape in the window; one /metrics scrape "
                   f"{scrape:.1f} ms of CPU ({scrape / 150:.2f}% of a core at one scrape every 15 s)")
    held = b.db.one(GUARDED)
    every = 900
    idle_rate = (u.get("cpu_pct") or 0) / 100.0
    if full is not None:
        guards, took_full, cpu_s = full
        per_guard = max(0.0, cpu_s - idle_rate * took_full) / guards if guards else 0.0
        how = (f"before the idle window the bench waited {took_full:.0f} s for the reconciler's full check "
               f"after the start; meanwhile it read {guards:,.0f} fences and op records, {cpu_s:.1f} s of "
               f"stocksvr CPU ({per_guard * 1e6:.1f} us each over the idle rate)")
    else:
        # No full check after the start (the last one is kept with each bucket): the cost of
        # the one every 15 min is measured with `stocksvr reconcile`, the same full check of
        # every bucket (paced alike), in a process of its own.
        guards, took_full, cpu_s = _cli_full_check(b)
        per_guard = cpu_s / guards if guards else 0.0
        how = (f"no full check ran after the start (each bucket's last one is kept); `stocksvr reconcile` "
               f"checked every bucket in full in {took_full:.0f} s, reading {guards:,.0f} fences and op "
               f"records with {cpu_s:.1f} s of CPU (process start included; {per_guard * 1e6:.1f} us each)")
    b.raw["reconcile_full_check"] = {"guards": guards, "secs": took_full, "cpu_s": cpu_s}
    amortized = 100.0 * per_guard * held / every
    b.fig.add("idle_full_check", f"the full check every {every} s, averaged", amortized, "% core",
              note=f"{held:,} held reservations; {how}")
    b.fig.add("idle_cpu_total", "idle CPU with the full check averaged in", (u.get("cpu_pct") or 0) + amortized,
              "% core", note="target < 1% of a core")
    # Which threads used it: the tokio workers (the processors' loops), librdkafka's broker
    # and main threads (fetch and metadata traffic), or others.
    by = {}
    for tid, (name, ticks) in threads.items():
        before = t0.get(tid, (name, 0))[1]
        by[name] = by.get(name, 0) + ticks - before
    used = sorted(((n, 100.0 * t / CLK_TCK / took) for n, t in by.items() if t > 0), key=lambda e: -e[1])
    b.raw["idle_threads"] = used
    if used:
        b.notes.append("idle CPU of stocksvr all by thread name (% of a core): "
                       + ", ".join(f"{n} {p:.2f}%" for n, p in used[:8]))
    b.fig.add("idle_sql", "idle MariaDB statements", rec["mysql"]["Questions"] / took, "stmt/s",
              note=f"{rec['mysql']['Com_commit'] / took:.1f} commits/s")


def _wait_full_check(b, still=10, timeout=300):
    """Waits until the reconciler's full check after the start of stocksvr all is over (its
    guard counter still for `still` s): that check reads every held reservation's fence and
    op record, paced, and is not the idle cost. Returns (guards read, seconds, stocksvr CPU
    seconds) over the wait, or None when it read none."""
    name = "stocksvr_reconcile_guards_read_total"
    pid = b.all.pid
    g0 = metric_sum(b.all.metrics(), name)
    t0 = time.time()
    seen = {"g": g0, "last": t0}
    c0 = read_proc(pid)

    def still_long_enough():
        now = metric_sum(b.all.metrics(), name)
        if now != seen["g"]:
            seen["g"], seen["last"] = now, time.time()
        return time.time() - seen["last"] >= still

    try:
        wait_until(still_long_enough, timeout, f"the guard counter to stay still for {still} s", interval=1.0)
    except WaitTimeout:
        pass  # a check that never ends is measured up to the timeout
    g = seen["g"]
    c1, t1 = read_proc(pid), time.time()
    if g == g0 or c0 is None or c1 is None:
        return None
    b.log(f"  (waited {t1 - t0:.0f} s for the reconciler's full check: {g - g0:,.0f} guards read)")
    return g - g0, t1 - t0, (c1[0] - c0[0]) / CLK_TCK


# The reservations whose fence and op record a full check reads (stocksvr_reconciler::queries::guards).
GUARDED = ("SELECT COUNT(*) FROM inventory_reservation WHERE status IN "
           f"{codes.sql_list((*codes.HOLDING, codes.CONFIRMED))} AND quantity > refunded_quantity")


def _cli_full_check(b):
    """`stocksvr reconcile` (check only) over every bucket: (guards read, seconds, CPU seconds)."""
    before = os.times()
    t0 = time.time()
    with open(os.path.join(b.logs, "reconcile-full-check.log"), "w") as log:
        code = subprocess.run([b.a.bin, "reconcile"], env=b.env, cwd=REPO, stdout=log,
                              stderr=subprocess.STDOUT, timeout=1800).returncode
    took = time.time() - t0
    after = os.times()
    if code not in (0, 1):
        raise BenchError(f"stocksvr reconcile exited {code} (log {b.logs}/reconcile-full-check.log)")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return b.db.one(GUARDED), took, cpu


def _thread_ticks(pid):
    """{tid: (thread name with its digits dropped, cpu ticks)} of every thread of pid."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")].rstrip("0123456789/")
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def _scrape_cost(b, n=50):
    """CPU milliseconds stocksvr all spends on one /metrics scrape (n scrapes back to back)."""
    pid = b.all.pid
    c0 = read_proc(pid)
    for _ in range(n):
        b.all.metrics()
    c1 = read_proc(pid)
    if c0 is None or c1 is None:
        return 0.0
    return (c1[0] - c0[0]) / CLK_TCK * 1000.0 / n


def part_durability(b):
    b.log("durability check")
    result = {}

    def projected_or_failed():
        result["ok"], result["lines"], projected = checks.check(b.db, b.redis, b.merchant, b.runs, b.extra_items)
        return projected or not result["ok"]

    try:
        wait_until(projected_or_failed, 120, "the projection to catch up with Redis", interval=2.0)
    except WaitTimeout:
        pass  # the check's lines say the projection is behind
    ok, lines = result["ok"], result["lines"]
    b.durable = ok
    b.durability = (["PASS"] if ok else ["FAIL"]) + lines
