#!/usr/bin/env python3
"""The soak (issue 51, item 6): `stocksvr all` under a steady order flow for hours, sampled
every 10 s; run by scripts/soak, which prepares the stack and the run's database first.

One process drives the flow and watches it (asyncio, one thread): paced Trys over keep-alive
connections (a slot every 1/rate s, taken by the first free connection; a Try is timed from
its send to its answer, as wrk does), one order item per order on `--dishes` dishes in turn,
and for every Try answered RESERVED an OrderCreated produced to the run's order.lifecycle.v1
as the order service would (stock Confluent producer and AvroSerializer, stocksvr_harness.avro),
so the reservation is CONFIRMED and not left RESERVED. One process rather than wrk plus a
producer: wrk would have to hand every reservation id over anyway. Whether the rate was reached
is measured, not assumed: trys_per_s in every row, and the verdict's `load` rule.

Every 10 s one row of soak.csv: stocksvr's RSS (VmRSS) and open descriptors (/proc), MariaDB
Threads_connected, consumer lag summed over the groups and the worst group's (stocksvr's lag
exporter on /metrics), the outbox backlog and its oldest row's age, the window's Try p99
(client side), Trys answered 2xx, RESERVED, failed (non-2xx or no answer) and CONFIRMED per
second (stocksvr_reservation_operations_total of confirm). A progress line every minute; at
the end soak.png (one panel per series) and the verdict (verdict.py): exit 0 PASS, 1 FAIL,
2 when the run itself failed.
"""

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import re
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pymysql

import verdict
from stocksvr_harness import HarnessError, avro, http
from stocksvr_harness.procs import Child

SAMPLE_S = 10
PROGRESS_S = 60
COLUMNS = ("t", "time", "rss_mb", "fds", "mysql_threads", "lag_total", "lag_worst", "lag_worst_group",
           "outbox_backlog", "outbox_oldest_s", "try_p99_ms", "trys_per_s", "reserved_per_s", "failed_per_s",
           "confirmed_per_s")
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text, names):
    """[(name, labels dict, value)] of the Prometheus text samples whose name is in `names`."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in names:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def metric_figures(text):
    """What a sample takes from /metrics: lag summed and per group, the outbox gauges, the
    count of Confirms that ended CONFIRMED (outcome `done`; `already_done` is a repeat)."""
    lag, backlog, oldest, confirmed = {}, None, None, 0.0
    for name, labels, value in parse_metrics(text, {"stocksvr_consumer_group_lag", "stocksvr_outbox_backlog",
                                                    "stocksvr_outbox_oldest_pending_seconds",
                                                    "stocksvr_reservation_operations_total"}):
        if name == "stocksvr_consumer_group_lag":
            group = labels.get("group", "?")
            lag[group] = lag.get(group, 0.0) + value
        elif name == "stocksvr_outbox_backlog":
            backlog = value
        elif name == "stocksvr_outbox_oldest_pending_seconds":
            oldest = value
        elif labels.get("operation") == "confirm" and labels.get("outcome") == "done":
            confirmed += value
    worst = max(lag.items(), key=lambda kv: kv[1]) if lag else (None, None)
    return {"lag_total": sum(lag.values()) if lag else None, "lag_worst": worst[1], "lag_worst_group": worst[0],
            "outbox_backlog": backlog, "outbox_oldest_s": oldest, "confirmed_total": confirmed}


def pct(values, p):
    """Nearest-rank percentile (None without values)."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, -(-len(v) * p // 100) - 1))
    return v[int(k)]


def proc_figures(pid):
    """(RSS in MB, open descriptors) of a process from /proc; (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:")), None)
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None, None


class Load:
    """Paced Trys over `conns` keep-alive connections; OrderCreated for each RESERVED one."""

    def __init__(self, host, port, rate, conns, merchant, dish0, dishes, producer, serializers, topic):
        self.host, self.port, self.rate, self.conns = host, port, rate, conns
        self.merchant, self.dish0, self.dishes = merchant, dish0, dishes
        self.producer, self.serializers, self.topic = producer, serializers, topic
        # Order ids unique on this stack: the start second (mod 10^6) before an 8-digit counter.
        self.id_base = (int(time.time()) % 1_000_000) * 100_000_000
        self.slot = 0
        self.t0 = None
        self.stop = False
        self.lat, self.ok, self.reserved, self.failed = [], 0, 0, 0
        self.produce_failed = 0
        self.errors = {}

    def take_window(self):
        """(latencies in ms, 2xx, RESERVED, failed) since the last call."""
        w = (self.lat, self.ok, self.reserved, self.failed)
        self.lat, self.ok, self.reserved, self.failed = [], 0, 0, 0
        return w

    def _next_due(self, loop):
        now = loop.time()
        if self.t0 is None:
            self.t0 = now
        self.slot += 1
        due = self.t0 + self.slot / self.rate
        # Behind by more than a second (a stall): the schedule moves on instead of bursting.
        if now - due > 1.0:
            self.t0 += now - due - 1.0
            due = now - 1.0
        return due

    async def _try(self, reader, writer, k):
        order_id = self.id_base + k
        body = (f'{{"order_id":{order_id},"order_item_id":{order_id},"merchant_id":{self.merchant},'
                f'"dish_id":{self.dish0 + k % self.dishes},"quantity":1,"order_type":"INSTANT"}}').encode()
        writer.write(b"POST /v1/reservations HTTP/1.1\r\nHost: stocksvr\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        if not m:
            raise ConnectionError("an answer without Content-Length")
        return order_id, status, await reader.readexactly(int(m.group(1)))

    def _confirm(self, order_id, answer):
        reservation = json.loads(answer).get("reservation") or {}
        if reservation.get("status") != "RESERVED":
            return False
        rid = int(reservation["reservation_id"])
        data = {"order_id": order_id, "merchant_id": self.merchant, "order_type": "INSTANT",
                "processing_time": None, "inventory_reservation_ids": [rid]}
        value = self.serializers.value("OrderCreated", avro.envelope(
            "OrderCreated", f"soak-oc-{order_id}", order_id, data, "soak-order-service"), self.topic)
        while True:
            try:
                self.producer.produce(self.topic, key=str(order_id).encode(), value=value,
                                      on_delivery=self._delivered)
                return True
            except BufferError:
                self.producer.poll(0.05)

    def _delivered(self, err, _msg):
        if err is not None:
            self.produce_failed += 1

    def _count_error(self, what):
        self.failed += 1
        self.errors[what] = self.errors.get(what, 0) + 1

    async def worker(self):
        loop = asyncio.get_running_loop()
        reader = writer = None
        while not self.stop:
            if writer is None:
                try:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                except OSError as e:
                    self._count_error(f"connect: {type(e).__name__}")
                    await asyncio.sleep(0.2)
                    continue
            due = self._next_due(loop)
            k = self.slot
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            sent = time.perf_counter()
            try:
                order_id, status, answer = await asyncio.wait_for(self._try(reader, writer, k), 10)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                    ValueError, IndexError) as e:
                self._count_error(f"transport: {type(e).__name__}")
                writer.close()
                reader = writer = None
                continue
            self.lat.append((time.perf_counter() - sent) * 1000)
            if 200 <= status < 300:
                self.ok += 1
                try:
                    if self._confirm(order_id, answer):
                        self.reserved += 1
                except (ValueError, KeyError, TypeError) as e:
                    self._count_error(f"answer: {type(e).__name__}")
            else:
                self._count_error(f"status {status}")
        if writer is not None:
            writer.close()

    async def pump(self):
        """Serves the producer's delivery callbacks."""
        while not self.stop:
            self.producer.poll(0)
            await asyncio.sleep(0.05)


class Sampler:
    def __init__(self, child, metrics_url, db, csv_path):
        self.child, self.metrics_url, self.db = child, metrics_url, db
        self.rows = []
        self.last_confirmed = None
        self.csv = open(csv_path, "w", newline="")  # noqa: SIM115 - kept open for the whole run
        self.writer = csv.DictWriter(self.csv, fieldnames=COLUMNS)
        self.writer.writeheader()

    def collect(self):
        """The server-side figures of one sample (blocking I/O: run off the event loop)."""
        rss, fds = proc_figures(self.child.pid)
        try:
            figures = metric_figures(http.call("GET", self.metrics_url, timeout=8)[1])
        except OSError:
            figures = {}
        threads = None
        try:
            with self.db.cursor() as cur:
                cur.execute("SHOW GLOBAL STATUS LIKE %s", ("Threads_connected",))
                threads = int(cur.fetchone()[1])
        except pymysql.MySQLError:
            try:  # the next sample tries again; this one has no figure
                self.db.ping(reconnect=True)
            except pymysql.MySQLError:
                pass
        return rss, fds, threads, figures

    def add(self, t, seconds, window, server):
        lat, ok, reserved, failed = window
        rss, fds, threads, figures = server
        confirmed = figures.get("confirmed_total")
        confirmed_per_s = None
        if confirmed is not None and self.last_confirmed is not None:
            confirmed_per_s = max(0.0, confirmed - self.last_confirmed) / seconds
        self.last_confirmed = confirmed if confirmed is not None else self.last_confirmed
        p99 = pct(lat, 99)
        row = {"t": round(t, 1), "time": dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S"),
               "rss_mb": rss, "fds": fds, "mysql_threads": threads,
               "lag_total": figures.get("lag_total"), "lag_worst": figures.get("lag_worst"),
               "lag_worst_group": figures.get("lag_worst_group"),
               "outbox_backlog": figures.get("outbox_backlog"), "outbox_oldest_s": figures.get("outbox_oldest_s"),
               "try_p99_ms": p99, "trys_per_s": ok / seconds, "reserved_per_s": reserved / seconds,
               "failed_per_s": failed / seconds, "confirmed_per_s": confirmed_per_s}
        self.rows.append(row)
        self.writer.writerow({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in row.items()})
        self.csv.flush()
        return row


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def progress(row, rows):
    recent = rows[-(PROGRESS_S // SAMPLE_S):]
    trys = sum(r["trys_per_s"] for r in recent) / len(recent)
    conf = [r["confirmed_per_s"] for r in recent if r["confirmed_per_s"] is not None]
    print(f"soak {row['time']} {row['t'] / 60:6.1f} min: {trys:6.0f} Trys/s, "
          f"{(sum(conf) / len(conf)) if conf else 0:6.0f} CONFIRMED/s, RSS {_f(row['rss_mb'], '.1f')} MB, "
          f"fds {_f(row['fds'], 'd')}, p99 {_f(row['try_p99_ms'], '.1f')} ms, lag {_f(row['lag_total'], '.0f')}, "
          f"backlog {_f(row['outbox_backlog'], '.0f')}, MySQL threads {_f(row['mysql_threads'], 'd')}",
          flush=True)


async def drive(args, child, load, sampler):
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(load.worker()) for _ in range(args.connections)]
    tasks.append(asyncio.create_task(load.pump()))
    start = loop.time()
    end = start + args.hours * 3600
    last, next_progress = start, start + PROGRESS_S
    try:
        while last < end:
            await asyncio.sleep(max(0.0, min(last + SAMPLE_S, end) - loop.time()))
            if not child.alive():
                raise HarnessError(f"stocksvr all exited with {child.returncode}: {child.last_error()}")
            now = loop.time()
            window = load.take_window()
            server = await loop.run_in_executor(None, sampler.collect)
            row = sampler.add(now - start, now - last, window, server)
            last = now
            if now >= next_progress:
                progress(row, sampler.rows)
                next_progress += PROGRESS_S
    finally:
        load.stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    return loop.time() - start


def create_buckets(api, merchant, dish0, dishes, total):
    """Today's and tomorrow's bucket (UTC) of every dish, so a run across midnight goes on."""
    today = dt.datetime.now(dt.timezone.utc).date()
    for day in (today, today + dt.timedelta(days=1)):
        for d in range(dishes):
            status, text = http.call("POST", f"{api}/admin/buckets", {
                "merchant_id": merchant, "dish_id": dish0 + d, "total": total,
                "stock_date": day.isoformat(), "timezone": "UTC"})
            if status >= 300:
                raise HarnessError(f"POST /admin/buckets for dish {dish0 + d} on {day}: {status} {text[:300]}")


def plot(rows, path, warm, ref_end, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rss_mb", "RSS (MB)"), ("fds", "open descriptors"), ("mysql_threads", "MariaDB Threads_connected"),
              ("lag_total", "consumer lag (records, all groups)"), ("outbox_backlog", "outbox backlog (rows)"),
              ("try_p99_ms", "Try p99, 10-s windows (ms)"), ("trys_per_s", "Trys/s (2xx) and CONFIRMED/s")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.1 * len(panels)), sharex=True)
    minutes = [r["t"] / 60 for r in rows]
    for ax, (col, label) in zip(axes, panels, strict=True):
        ax.plot(minutes, [r[col] for r in rows], lw=0.9, label=col)
        if col == "trys_per_s":
            ax.plot(minutes, [r["confirmed_per_s"] for r in rows], lw=0.9, label="confirmed_per_s")
            ax.legend(loc="lower right", fontsize=7)
        ax.axvline(warm / 60, color="grey", ls="--", lw=0.8)
        if col == "try_p99_ms":
            ax.axvline(ref_end / 60, color="orange", ls=":", lw=0.8)
        ax.set_ylabel(label, fontsize=7)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes (grey: end of warm-up; orange: end of the p99 reference)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def mysql_connect(url):
    u = urllib.parse.urlparse(url)
    return pymysql.connect(host=u.hostname, port=u.port or 3306, user=urllib.parse.unquote(u.username or ""),
                           password=urllib.parse.unquote(u.password or ""), database=u.path.lstrip("/"),
                           autocommit=True, connect_timeout=10, read_timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the stocksvr binary")
    ap.add_argument("--hours", type=float, required=True, help="length of the load (fractions: 0.1 = 6 min)")
    ap.add_argument("--rate", type=float, default=500, help="Trys per second asked (default 500)")
    ap.add_argument("--dishes", type=int, default=100, help="dishes the Trys go round (default 100)")
    ap.add_argument("--connections", type=int, default=128, help="keep-alive connections (default 128)")
    ap.add_argument("--out", required=True, help="run folder: soak.csv, soak.png, stocksvr.log")
    args = ap.parse_args()
    env = os.environ
    ns = env["STOCKSVR__KAFKA__TOPIC_NAMESPACE"]
    listen = env["STOCKSVR__HTTP__LISTEN"]
    host, port = listen.rsplit(":", 1)
    api = f"http://{listen}"
    merchant = 700000 + os.getpid() % 100000
    dish0 = 100000 + int(time.time()) % 50000

    child = Child([args.bin, "all"], os.path.join(args.out, "stocksvr.log"), env=dict(env),
                  new_session=True).start()
    try:
        http.wait_http(f"{api}/readyz", 180, "stocksvr all", child=child)
        create_buckets(api, merchant, dish0, args.dishes, 1_000_000_000)
        topic = f"{ns}.order.lifecycle.v1"
        producer = avro.order_producer(env["STOCKSVR__KAFKA__BROKERS"], "soak-order-service", linger_ms=5)
        serializers = avro.Serializers(env["STOCKSVR__REGISTRY__URL"], events=("OrderCreated",))
        load = Load(host, int(port), args.rate, args.connections, merchant, dish0, args.dishes, producer,
                    serializers, topic)
        db = mysql_connect(env["STOCKSVR__MYSQL__URL"])
        sampler = Sampler(child, f"{api}/metrics", db, os.path.join(args.out, "soak.csv"))
        print(f"soak: {args.rate:.0f} Trys/s asked over {args.connections} connections on {args.dishes} dishes, "
              f"each RESERVED one confirmed by an OrderCreated; {args.hours:g} h; stocksvr all pid {child.pid}; "
              f"samples every {SAMPLE_S} s to {args.out}/soak.csv", flush=True)
        duration = asyncio.run(drive(args, child, load, sampler))
        left = producer.flush(30)
        rss, fds = proc_figures(child.pid)
    finally:
        code, clean = child.stop(grace=60)
    rows = sampler.rows
    passed, lines = verdict.judge(rows, duration, args.rate)
    warm = verdict.warmup(duration)
    ref_end = verdict.p99_blocks([r for r in rows if r["t"] >= warm], duration, warm)[0]
    png = os.path.join(args.out, "soak.png")
    plot(rows, png, warm, ref_end, f"stocksvr soak: {args.rate:.0f} Trys/s asked, {duration / 3600:.2f} h, "
                                   f"{args.dishes} dishes ({'PASS' if passed else 'FAIL'})")
    print(f"\nsoak of {duration / 60:.1f} min at {args.rate:.0f} Trys/s asked ({os.cpu_count()} cores)")
    print(f"  last RSS {_f(rss, '.1f')} MB, {_f(fds, 'd')} descriptors; stocksvr stopped with {code}"
          f"{'' if clean else ' (SIGKILL after the grace)'}; OrderCreated not acknowledged: "
          f"{left + load.produce_failed}; failed Trys by kind: {load.errors or 'none'}")
    for line in lines:
        print(f"  {line}")
    print(f"  csv {sampler.csv.name}\n  png {png}")
    print(f"soak: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"soak: {e}", file=sys.stderr)
        sys.exit(2)
