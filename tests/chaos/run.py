#!/usr/bin/env python3
"""The fault-injection run: private stack, roles, seeded workload and faults, quiescence,
checker, replay, summary. Called by scripts/chaos (which builds the binary and the venv); see
tests/chaos/README.md.

Exit status: 0 no anomaly, 1 anomalies found, 2 the run itself failed (setup, a crash).
"""

import argparse
import collections
import datetime as dt
import faulthandler
import json
import os
import shutil
import signal
import sys
import time
import traceback

import redis as redis_lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import cluster
import faults as faults_mod
import history as history_mod
import replay as replay_mod
from checker import Checker
from state import State
from stocksvr_harness import REPO
from system import API_ROLES, ROLES, System
from workload import Config, EventProducer, Workload, noon_zone


def log(msg):
    print(f"chaos {time.strftime('%H:%M:%S')}: {msg}", flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="workload duration (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", default="", help="comma list of fault kinds/groups (default: all); "
                    "'none' for a run without faults. Kinds: " + ", ".join(faults_mod.ALL_KINDS))
    ap.add_argument("--ci", action="store_true", help="short caps: stop/toxic faults <= 10 s, 3-8 s between "
                    "faults, quiescence deadline 180 s, hold TTL 30 s, 4 workers")
    ap.add_argument("--bin", required=True, help="the stocksvr binary to test")
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("CHAOS_PORT_BASE", "24000")),
                    help="private stack ports (scripts/stack STACK_PORT_BASE; default 24000)")
    ap.add_argument("--cache", default=os.environ.get("STACK_CACHE", os.path.join(REPO, ".stack", "cache")),
                    help="download cache shared with the default stack (STACK_CACHE)")
    ap.add_argument("--run-dir", help="default /tmp/stocksvr-chaos/seed<S>-<time>")
    ap.add_argument("--stop-cap", type=float, help="longest SIGSTOP/toxic fault, seconds (default 60; --ci 10)")
    ap.add_argument("--fault-gap", help="MIN,MAX seconds between faults (default 5,15; --ci 3,8)")
    ap.add_argument("--quiesce-deadline", type=float, help="seconds (default 420; --ci 180)")
    ap.add_argument("--hold-ttl", type=int, help="reservation.hold_ttl_secs of the roles (default 60; --ci 30)")
    ap.add_argument("--workers", type=int, help="concurrent order clients (default 6; --ci 4)")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay-from-earliest comparison")
    ap.add_argument("--keep", action="store_true", help="leave the private stack running at the end")
    ap.add_argument("--kafka-brokers", type=int, default=1, help="a Kafka cluster of N brokers (scripts/stack "
                    "--kafka-brokers; topics with 3 replicas, min.insync.replicas 2; no Kafka proxy)")
    ap.add_argument("--instances", type=int, default=0, help="run N `stocksvr all` processes (all-1..all-N, API on "
                    "B+46..) instead of one process per role; Trys round-robin over them")
    ap.add_argument("--orders", type=int, help="stop the workload after this many orders (or at --minutes)")
    ap.add_argument("--fault-at-order", help="N[,N2,..]: inject one fault when N orders have started (and one at "
                    "each further N), instead of a fault every --fault-gap; as many --faults kinds as points: "
                    "in that order, else drawn")
    ap.add_argument("--secure", action="store_true", help="the stack secured (scripts/stack up --secure): TLS, "
                    "SASL and client certificates through the proxies, the roles with only the printed ACLs")
    ap.add_argument("--previous-bin", help="an upgrade run (scripts/chaos --upgrade-from REV): the instances "
                    "start on this binary of the previous release, and a roll-upgrade fault moves them to --bin "
                    "(default then: --instances 3, --faults roll-upgrade)")
    a = ap.parse_args(argv)
    if a.previous_bin:
        a.instances = a.instances or 3
        a.faults = a.faults or "roll-upgrade"
        # A roll happens once: at an order count, not every --fault-gap.
        a.fault_at_order = a.fault_at_order or "300"
    if a.secure and a.kafka_brokers > 1:
        ap.error("--secure runs with one broker (behind its proxy); not with --kafka-brokers")
    a.stop_cap = a.stop_cap or (10.0 if a.ci else 60.0)
    a.fault_gap = tuple(float(x) for x in (a.fault_gap or ("3,8" if a.ci else "5,15")).split(","))
    a.quiesce_deadline = a.quiesce_deadline or (180.0 if a.ci else 420.0)
    a.hold_ttl = a.hold_ttl or (30 if a.ci else 60)
    if a.fault_at_order is not None:
        a.fault_at_order = [int(x) for x in a.fault_at_order.split(",")]
    return a


class Run:
    def __init__(self, a):
        self.a = a
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = a.run_dir or os.path.join("/tmp/stocksvr-chaos", f"seed{a.seed}-{stamp}")
        os.makedirs(self.dir, exist_ok=True)
        self.history = history_mod.History(os.path.join(self.dir, "history.jsonl"))
        # Merchants 501-503 have no zone of their own: every stocksvr process (roles and
        # commands) gets the run's noon zone as the default, picked once (see noon_zone).
        self.zone_name, self.zone = noon_zone(dt.datetime.now(dt.timezone.utc).hour)
        settings = {
            "STOCKSVR__RESERVATION__DEFAULT_TIMEZONE": self.zone_name,
            "STOCKSVR__RESERVATION__HOLD_TTL_SECS": str(a.hold_ttl),
            "STOCKSVR__LOG__FILTER": "info,librdkafka=warn,sqlx=warn",
            # No load balancer in front: a stopped role stops accepting at once (the replay
            # stops every role twice, one after the other).
            "STOCKSVR__HTTP__DRAIN_GRACE_MS": "0",
        }
        self.system = System(REPO, self.dir, a.port_base, a.cache, a.bin, self.history, settings,
                             kafka_brokers=a.kafka_brokers, secure=a.secure, previous_binary=a.previous_bin)
        if a.previous_bin:
            self.system.on_previous.update(ROLES)
        self.cluster_results = []  # what the scale-out faults saw (cluster.py)
        self.state = None
        self.faults = None
        self.workload = None
        self.producer = None
        self.times = collections.OrderedDict()
        self.anomalies = []
        self.notes = []
        self.rebuild_available = False

    def phase(self, name):
        log(name)
        self.history.record("phase", name=name)

    def anomaly(self, check, ids, detail):
        self.anomalies.append({"check": check, "ids": ids, "detail": detail})

    # ---- setup --------------------------------------------------------------------------

    def setup(self):
        a, s = self.a, self.system
        self.phase(f"setup: private stack in {s.stack_dir} on ports {a.port_base}+ (kafka {s.port['kafka']}, "
                   f"mariadb {s.port['mariadb']}, redis {s.port['redis']}, registry {s.port['registry']}); "
                   f"merchants' zone {self.zone_name}{'; secure' if a.secure else ''}")
        t0 = time.monotonic()
        s.stack_up()
        s.toxiproxy("up")
        self.times["stack up"] = time.monotonic() - t0
        t0 = time.monotonic()
        if a.secure:
            self.grant_printed_acls()
        c = s.clients
        upgrade = bool(a.previous_bin)
        if upgrade:
            # The previous release must accept every setting the harness gives it (a setting new
            # in this release belongs in system.NEW_SINCE_PREVIOUS).
            rc, out, err = s.cli("config", previous=True)
            if rc != 0:
                raise RuntimeError(f"the previous release refuses the run's settings ({rc}): {(out + err)[-500:]}")
        failed = self.release_steps(previous=upgrade)
        if failed:
            raise RuntimeError("; ".join(f"stocksvr {step} failed: {detail}" for step, detail in failed))
        rc, out, err = s.cli("bucket", "--help")
        self.rebuild_available = "rebuild" in out
        self.notes.append("`stocksvr bucket rebuild` " + ("exists: redis-empty can run" if self.rebuild_available
                          else "does not exist (issue 10): fault kind redis-empty stays off"))
        self.state = State(s.port["mariadb"], s.port["redis"], s.kafka_direct, clients=c)
        # A new client per probe in every run (README, "In a Kafka cluster run"): a long-lived
        # one crashed the harness in librdkafka after broker kills, in cluster runs and, with
        # exit 139 right after the workload, in a CI short run (one broker, kill-kafka faults).
        self.state.fresh_kafka_clients = True
        self.producer = EventProducer(self.history, s.kafka_direct, s.registry_url, clients=c if a.secure else None)
        cfg = Config(ci=a.ci)
        if a.workers:
            cfg.workers = a.workers
        cfg.max_orders = a.orders
        cfg.round_robin = bool(a.instances)
        today = dt.datetime.now(self.zone).date()
        reader = redis_lib.Redis(host="127.0.0.1", port=s.port["redis"], decode_responses=True,
                                 socket_timeout=2, socket_connect_timeout=2, **c.redis())
        self.workload = Workload(self.history, [s.api_url(r) for r in API_ROLES], self.producer, a.seed, cfg, today,
                                 self.zone, redis_direct=reader)
        buckets = self.workload.plan_buckets()
        for b in buckets:
            rc, out, err = s.cli("bucket", "init", "--merchant-id", str(b.merchant), "--dish-id", str(b.dish),
                                 "--total", str(b.totals[0]), "--date", b.date.isoformat(), previous=upgrade)
            self.history.record("bucket_init", bucket=b.bucket_id, total=b.totals[0], hot=b.hot, rc=rc,
                                output=(out + err)[-300:])
            if rc != 0:
                raise RuntimeError(f"stocksvr bucket init {b.bucket_id} failed ({rc}): {(out + err)[-300:]}")
        # Warm the serializers: schema ids cached before any registry fault.
        for name in ("OrderCreated", "OrderCreatedFailed", "OrderCanceled", "RefundRequested"):
            with open(os.path.join(REPO, "schemas", "examples", f"{name}.json"), encoding="utf-8") as f:
                self.producer.serialize(name, json.load(f))
        self.producer.start()
        for role in ROLES:
            s.start_role(role)
        for role in ROLES:
            if not s.wait_healthy(role, 90):
                raise RuntimeError(f"role {role} did not answer /healthz (log: {s.logs}/role-{role}.log)")
        self.times["setup (migrate, topics, schemas, buckets, roles)"] = time.monotonic() - t0

    def release_steps(self, previous):
        """The operator's steps of a release (migrate, topics, schemas) with the previous
        release's binary or this one; [(step, what failed)]. Secure: migrations as the MariaDB
        admin, topics as the Kafka topic admin (the service's own users may do neither);
        plaintext: these settings are empty."""
        s, c = self.system, self.system.clients
        steps = ((("migrate",), c.mysql_admin_env()), (("topics", "apply"), c.kafka_principal_env("TOPICS_ADMIN")),
                 (("schemas", "register"), {}))
        failed = []
        for args, env in steps:
            rc, out, err = s.cli(*args, timeout=300, env=env, previous=previous)
            if rc != 0:
                failed.append((" ".join(args), f"exit {rc}: {(out + err)[-500:]}"))
        return failed

    def grant_printed_acls(self):
        """The ACLs `stocksvr acls print --role all` prints, applied as an operator would
        (scripts/stack acls apply): the only ones the roles and the order service have."""
        s = self.system
        rc, out, err = s.cli("acls", "print", "--role", "all")
        if rc != 0:
            raise RuntimeError(f"stocksvr acls print failed ({rc}): {(out + err)[-500:]}")
        path = os.path.join(self.dir, "acls.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(out)
        s.stack.script("stack", "acls", "apply", path, timeout=600)
        granted = sum(line.startswith("kafka-acls ") for line in out.splitlines())
        self.notes.append(f"secure: every connection TLS; Kafka ACLs only the {granted} lines "
                          "`stocksvr acls print --role all` printed (acls.txt)")

    # ---- the run ------------------------------------------------------------------------

    def run_workload(self):
        a = self.a
        kinds = [] if a.faults == "none" else faults_mod.parse_kinds(a.faults)
        if "redis-empty" in kinds and not self.rebuild_available:
            kinds.remove("redis-empty")
            self.notes.append("redis-empty was asked for but removed: no `stocksvr bucket rebuild`")
        once_at = None if a.fault_at_order is None else (lambda: self.workload.order_index, a.fault_at_order)
        self.faults = faults_mod.Faults(self.system, self.history, a.seed, kinds, a.stop_cap, a.fault_gap,
                                        self.rebuild_available, once_at=once_at, run_ref=self)
        self.phase(f"workload for {a.minutes} min, seed {a.seed}, faults: {', '.join(kinds) or 'none'}")
        t0 = time.monotonic()
        self.workload.start()
        self.faults.start()
        end = t0 + a.minutes * 60
        next_report = t0 + 30
        while time.monotonic() < end:
            if a.orders is not None and self.workload.order_index >= a.orders + self.workload.cfg.workers:
                break  # every worker passed the last order number: the flow is done
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            # A role that died by itself (not by a fault) is restarted, and recorded.
            # (Not while a fault holds the lock: it may be restarting that role itself.)
            if self.faults.lock.acquire(blocking=False):
                try:
                    for role in ROLES:
                        if role in self.system.procs and not self.system.role_alive(role):
                            self.role_exited(role, "the workload")
                            self.system.start_role(role)
                finally:
                    self.faults.lock.release()
            if time.monotonic() >= next_report:
                next_report += 30
                c = self.workload.counts
                log(f"  {int(time.monotonic() - t0)}s: orders {self.workload.order_index}, trys "
                    f"{c.get('try single', 0) + c.get('try order', 0)}, events acked {self.producer.acked}, "
                    f"faults {sum(self.faults.counts.values())}")
        if a.fault_at_order is not None and self.faults.thread.is_alive():
            # The one fault of a scale-out run finishes (restart, catch-up, rebalance) unhurried.
            self.phase("waiting for the fault in progress to finish")
            self.faults.thread.join(timeout=400)
        self.phase("stopping faults and workload")
        self.faults.stop()
        if a.fault_at_order is not None:
            # A scale-out run tests its faults: one not injected, or not all of them, fails it.
            for kind, detail in self.faults.failures:
                self.anomaly("fault_not_injected", {"kind": kind}, detail)
            injected = sum(self.faults.counts.values())
            if injected < len(a.fault_at_order):
                self.anomaly("fault_not_injected", {"points": a.fault_at_order},
                             f"{injected} of {len(a.fault_at_order)} faults ran (the workload ended first?)")
        alive = self.workload.stop()
        if alive:
            self.notes.append(f"workload threads still running at stop: {alive}")
        left = self.producer.finish(180)
        if left:
            self.notes.append(f"{left} order events not acknowledged by Kafka at the end")
        self.times["workload"] = time.monotonic() - t0

    def role_exited(self, role, during):
        """A role process that ended without being killed by a fault: an anomaly (a dependency
        fault must not stop a processor; seed 10, issue 9.4), with its exit status, the last
        error it logged, and the faults of the 30 s before."""
        p = self.system.procs.get(role)
        rc = None if p is None else p.returncode
        self.system.reap(role)
        now = time.monotonic()
        recent = []
        for r in history_mod.load(self.history.path):
            if r["kind"] == "fault_start" and now - r["mono"] < 30:
                recent.append(f"{r['fault_kind']}@{r['wall'][11:19]}")
        self.anomaly("role_exited", {"role": role, "returncode": rc, "pid": None if p is None else p.pid},
                     f"exited by itself during {during} (restarted); faults in the 30 s before: "
                     f"{recent or 'none'}; last error: {self.system.exit_reason(role)}")

    def heal(self):
        """Undo every fault: toxics off, servers running and continued, every role running."""
        s = self.system
        s.toxi_reset()
        s.continue_servers()
        s.stack_up()
        for role in ROLES:
            if not s.role_alive(role):
                if role in s.procs:
                    self.role_exited(role, "healing")
                s.start_role(role)

    def quiesce(self, name):
        self.phase(f"quiescence ({name}): outbox empty, consumer lag 0, no intermediate reservation, "
                   f"WAL done, due scheduled confirms done, stale RESERVED rows alerted, "
                   f"no parked order event, no suspected reconcile difference")
        shown = [0.0]

        def tick(p):
            for role in ROLES:
                if role in self.system.procs and not self.system.role_alive(role):
                    self.role_exited(role, f"quiescence ({name})")
                    self.system.start_role(role)
            # Progress every 10 s, short: the full last state goes to the history at the end.
            if time.monotonic() - shown[0] >= 10:
                shown[0] = time.monotonic()
                log(f"  pending: {json.dumps(p)[:300]}")
        ok, secs, pending = self.state.wait_quiescent(self.a.quiesce_deadline, on_tick=tick,
                                                      hold_ttl_grace=45)
        self.history.record("quiescence", name=name, ok=ok, seconds=secs, pending=pending)
        self.times[f"time to quiescence ({name})"] = secs
        if not ok:
            self.anomaly("quiescence", {"phase": name}, f"not quiescent after {secs}s: {json.dumps(pending)[:600]}")
        return ok

    def check(self):
        self.phase("checking the history and the final state")
        records = history_mod.load(self.history.path)
        checker = Checker(records, self.workload.bucket_plan(), self.state)
        found = checker.run()
        self.anomalies.extend(found)
        self.checker = checker
        for check, n in checker.per_check.items():
            if n > checker.limit:
                self.notes.append(f"{check}: {n} anomalies, only the first {checker.limit} listed")

    def replay(self):
        s = self.system
        self.phase("replay: roles stopped, dump, every group to earliest, roles again, dump, compare")
        t0 = time.monotonic()
        s.stop_all_roles()
        if self.state.fresh_kafka_clients:
            self.state.reset_kafka_clients()
        before = replay_mod.dump(self.state)
        failures = replay_mod.reset_offsets(s, self.state, self.history)
        for group, topic, out in failures:
            self.anomaly("replay", {"group": group, "topic": topic}, f"offsets reset failed: {out}")
        for role in ROLES:
            s.start_role(role)
        for role in ROLES:
            s.wait_healthy(role, 90)
        self.quiesce("after replay")
        s.stop_all_roles()
        after = replay_mod.dump(self.state)
        self.replay_counts = {}
        for check, ids, detail in replay_mod.diff(before, after, counts=self.replay_counts):
            self.anomaly(check, ids, detail)
        with open(os.path.join(self.dir, "dump-before-replay.json"), "w") as f:
            json.dump(before, f, sort_keys=True)
        with open(os.path.join(self.dir, "dump-after-replay.json"), "w") as f:
            json.dump(after, f, sort_keys=True)
        self.times["replay"] = time.monotonic() - t0

    # ---- summary ------------------------------------------------------------------------

    def summary(self):
        records = history_mod.load(self.history.path)
        ops = collections.Counter()
        http = collections.Counter()
        for r in records:
            if r["kind"] == "request":
                ops[f"http {r['op_kind']}"] += 1
            elif r["kind"] == "response":
                http[f"{r['op_kind']} {r['status']}"] += 1
            elif r["kind"] == "timeout":
                http[f"{r['op_kind']} no answer"] += 1
            elif r["kind"] == "produce_ack":
                label = "invalid (intended dead letter)" if r.get("intended_dlt") else r.get("event_type")
                ops[f"event acked {label}{' (duplicate)' if r.get('dup') else ''}"] += 1
            elif r["kind"] == "produce_error":
                ops["event NOT acked"] += 1
            elif r["kind"] == "order":
                ops[f"order fate {r['fate']}"] += 1
        lines = []

        def table(title, rows, headers):
            lines.append("")
            lines.append(title)
            if not rows:
                lines.append("  (none)")
                return
            w = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
            lines.append("  " + "  ".join(str(h).ljust(w[i]) for i, h in enumerate(headers)))
            for r in rows:
                lines.append("  " + "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i])
                                              for i, c in enumerate(r)))

        table("operations", sorted(ops.items()), ("kind", "count"))
        table("HTTP answers", sorted(http.items()), ("op status", "count"))
        fc = self.faults.counts if self.faults else {}
        table("faults", [(k, fc[k], f"{self.faults.seconds.get(k, 0):.0f}s") for k in sorted(fc)],
              ("kind", "count", "time"))
        an = collections.Counter(x["check"] for x in self.anomalies)
        if getattr(self, "checker", None):
            for check, n in self.checker.per_check.items():
                an[check] = max(an[check], n)
        # A replay anomaly is a table: count its differing rows (only 30 per kind are listed).
        for check, n in getattr(self, "replay_counts", {}).items():
            an[check] = n
        table("anomalies (replay.*: rows or keys that differ)", sorted(an.items()), ("check", "count"))
        table("times", [(k, f"{v:.1f}s") for k, v in self.times.items()], ("phase", "seconds"))
        if self.cluster_results:
            lines.append("")
            lines.append("scale-out faults (cluster.py):")
            for r in self.cluster_results:
                lines.append("  " + json.dumps({k: v for k, v in r.items() if k != "members_after"}, default=str))
        if self.workload:
            lines.append("")
            lines.append(f"orders started: {min(self.workload.order_index, self.a.orders or 10**9)}")
        if getattr(self, "checker", None):
            table("state", list(self.checker.stats.items()), ("what", "n"))
        if self.faults and self.faults.failures:
            lines.append("")
            lines.append("faults that could not be injected:")
            for k, d in self.faults.failures[:20]:
                lines.append(f"  {k}: {d}")
        if self.notes:
            lines.append("")
            lines.append("notes:")
            for n in self.notes:
                lines.append(f"  - {n}")
        if self.anomalies:
            lines.append("")
            lines.append(f"anomalies ({len(self.anomalies)} listed; all in {self.dir}/anomalies.jsonl):")
            shown = collections.Counter()
            for x in self.anomalies:
                shown[x["check"]] += 1
                if shown[x["check"]] <= 6:
                    lines.append(f"  ANOMALY {x['check']} {json.dumps(x['ids'], default=str)}: "
                                 f"{str(x['detail'])[:500]}")
                elif shown[x["check"]] == 7:
                    lines.append(f"  ANOMALY {x['check']} ... (more in anomalies.jsonl)")
        text = "\n".join(lines)
        print(text, flush=True)
        with open(os.path.join(self.dir, "summary.txt"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(self.dir, "anomalies.jsonl"), "w") as f:
            for x in self.anomalies:
                f.write(json.dumps(x, default=str) + "\n")
                self.history.record("anomaly", **x)
        with open(os.path.join(self.dir, "summary.json"), "w") as f:
            json.dump({"seed": self.a.seed, "minutes": self.a.minutes, "operations": ops, "http": http,
                       "faults": fc, "anomalies": an, "times": self.times, "notes": self.notes},
                      f, indent=1, default=str)


def drop_stack_data(stack_dir):
    """A run without anomaly leaves its history, summary, dumps and logs, but not the private
    stack's data (about 600 MB of Kafka and MariaDB files a run: two seeds per CI run filled
    24 GB of /tmp in a day). A failing run, or one with --keep, leaves everything."""
    data = os.path.join(stack_dir, "data")
    if not os.path.isdir(data):
        return
    size = 0
    for d, _, files in os.walk(data):
        for f in files:
            try:
                size += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    shutil.rmtree(data, ignore_errors=True)
    log(f"no anomaly: removed the private stack's data ({size / 1e6:.0f} MB); its logs stay in "
        f"{os.path.join(stack_dir, 'logs')}")


def main(argv):
    a = parse_args(argv)
    cluster.configure(a.instances, a.kafka_brokers)
    faults_mod.reconfigure(a.kafka_brokers)
    # SIGTERM (a CI timeout, Ctrl-C of the wrapper) unwinds like Ctrl-C: the finally block below
    # still stops every process this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # A crash inside a native client (librdkafka, the MySQL driver) kills the run with a
    # signal and no Python traceback: print every thread's stack first, so it names its place.
    faulthandler.enable(all_threads=True)
    run = Run(a)
    log(f"run folder {run.dir} (history.jsonl, summary.txt, anomalies.jsonl, logs/)")
    t0 = time.monotonic()
    code = 2
    try:
        run.setup()
        run.run_workload()
        run.phase("healing: toxics removed, servers continued and up, every role running")
        run.heal()
        run.quiesce("after the workload")
        run.check()
        if not a.no_replay:
            run.replay()
        code = 1 if run.anomalies else 0
    except Exception as e:
        traceback.print_exc()
        run.anomalies.append({"check": "run_failed", "ids": {}, "detail": f"{type(e).__name__}: {e}"})
        code = 2
    finally:
        run.times["total"] = time.monotonic() - t0
        try:
            run.summary()
        except Exception:
            traceback.print_exc()
        if run.state:
            run.state.close()
        if not a.keep:
            log("stopping the roles, toxiproxy and the private stack")
            run.system.kill_everything()
            if code == 0:
                drop_stack_data(run.system.stack_dir)
        else:
            log(f"--keep: the private stack stays up (STACK_DIR={run.system.stack_dir}, "
                f"STACK_PORT_BASE={a.port_base})")
        run.history.close()
    verdict = {0: "no anomaly", 1: f"{len(run.anomalies)} anomalies", 2: "the run failed"}[code]
    log(f"done in {time.monotonic() - t0:.0f}s: {verdict} (exit {code}); folder {run.dir}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
