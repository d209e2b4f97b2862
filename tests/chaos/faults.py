"""Faults, chosen at random with the seed and recorded (fault_start / fault_end).

Kinds (`--faults` takes a comma list of kinds or groups; default: every kind in DEFAULT):

  kill-<role>          kill -9 one role process, restart it after 0-3 s
                       (roles: order-lifecycle outbox-relay projector dead-letter schedule all)
  stop-<server>        SIGSTOP mariadb | redis | kafka | registry for 2 s .. --stop-cap, then SIGCONT
  kill-kafka           kill -9 the broker, restart it (`scripts/stack up kafka`: recovers its log dir)
  kill-redis           kill -9 Redis, restart it from its AOF (appendfsync everysec: up to ~1 s of
                       acknowledged writes can be lost, which the checker then reports)
  latency-<proxy>      toxiproxy latency 200-2500 ms (+-25 % jitter) on mysql | redis | kafka
  reset-<proxy>        toxiproxy reset_peer: every connection is reset (TCP RST) while it lasts
  blackhole-<proxy>    toxiproxy timeout toxic with timeout 0: data is dropped and connections hang
                       until the toxic is removed (a stalled network, no error)
  redis-empty          kill -9 Redis, delete its data, restart it empty, then
                       `stocksvr bucket rebuild --all --execute` (Trys fail closed with 503
                       bucket_lost until each bucket is rebuilt and reopened)

Groups: kill-role, stop, toxic, all (= DEFAULT). Durations of stop/toxic faults are drawn from
[2 s, --stop-cap]; a fault in progress is cut short when the workload ends.
"""

import os
import random
import shutil
import signal
import threading
import time

import cluster
from system import ROLES

ROLE_KINDS = [f"kill-{r}" for r in ROLES]
STOP_KINDS = ["stop-mariadb", "stop-redis", "stop-kafka", "stop-registry"]
TOXIC_KINDS = [f"{t}-{p}" for t in ("latency", "reset", "blackhole") for p in ("mysql", "redis", "kafka")]
DEFAULT = ROLE_KINDS + STOP_KINDS + ["kill-kafka", "kill-redis", "redis-empty"] + TOXIC_KINDS
ALL_KINDS = DEFAULT + cluster.KINDS
GROUPS = {"kill-role": ROLE_KINDS, "stop": STOP_KINDS, "toxic": TOXIC_KINDS, "all": DEFAULT}


def reconfigure(kafka_brokers):
    """After cluster.configure changed the roles: the role kinds follow, and a Kafka cluster
    (no proxy in front of it) has no Kafka toxics."""
    ROLE_KINDS[:] = [f"kill-{r}" for r in ROLES]
    if kafka_brokers > 1:
        TOXIC_KINDS[:] = [k for k in TOXIC_KINDS if not k.endswith("-kafka")]
    DEFAULT[:] = ROLE_KINDS + STOP_KINDS + ["kill-kafka", "kill-redis", "redis-empty"] + TOXIC_KINDS
    ALL_KINDS[:] = DEFAULT + cluster.KINDS


def parse_kinds(spec):
    if not spec:
        return list(DEFAULT)
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if part in GROUPS:
            out.extend(k for k in GROUPS[part] if k not in out)
        elif part in ALL_KINDS:
            if part not in out:
                out.append(part)
        else:
            raise ValueError(f"unknown fault kind {part!r}; known: {', '.join(ALL_KINDS)} "
                             f"and groups {', '.join(GROUPS)}")
    return out


class Faults:
    def __init__(self, system, history, seed, kinds, stop_cap, gap, rebuild_available, once_at=None,
                 run_ref=None):
        self.system = system
        self.history = history
        self.rng = random.Random(f"{seed}:faults")
        self.kinds = list(kinds)
        self.stop_cap = max(2.0, stop_cap)
        self.gap = gap
        self.rebuild_available = rebuild_available
        # once_at: (callable giving the orders started so far, [N1, N2, ..]): one fault when each
        # Ni is reached, then no more (the scale-out tests: kills mid-flow); with as many kinds as
        # points, the kinds in the order given. run_ref: the Run (cluster kinds).
        self.once_at = once_at
        self.run_ref = run_ref
        self.stop_event = threading.Event()
        self.counts = {}
        self.seconds = {}
        self.failures = []
        self.n = 0
        self.thread = threading.Thread(target=self.loop, name="faults", daemon=True)
        # Serialises fault actions with quiescence repairs (both restart servers and roles).
        self.lock = threading.Lock()

    def start(self):
        if self.kinds:
            self.thread.start()

    def stop(self, deadline_s=120.0):
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=deadline_s)
        return not self.thread.is_alive()

    def hold(self, seconds):
        """Sleep up to `seconds`; returns early when the run is ending."""
        self.stop_event.wait(seconds)

    def duration(self):
        return round(self.rng.uniform(2.0, self.stop_cap), 1)

    def loop(self):
        fired = 0
        while True:
            kind = None
            if self.once_at is not None:
                orders, points = self.once_at
                if fired >= len(points):
                    return
                if self.stop_event.wait(0.5):
                    return
                if orders() < points[fired]:
                    continue
                if len(self.kinds) == len(points):
                    kind = self.kinds[fired]
                fired += 1
            elif self.stop_event.wait(self.rng.uniform(*self.gap)):
                return
            kind = kind or self.rng.choice(self.kinds)
            self.n += 1
            fid = self.n
            t0 = time.monotonic()
            with self.lock:
                try:
                    target, _params, detail = self.run(kind, fid)
                    ok = True
                except Exception as e:  # recorded: a fault that could not be injected is a finding too
                    target, detail, ok = None, f"{type(e).__name__}: {e}", False
                    self.failures.append((kind, detail))
            secs = time.monotonic() - t0
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.seconds[kind] = self.seconds.get(kind, 0.0) + secs
            self.history.record("fault_end", fault=fid, fault_kind=kind, target=target, ok=ok, detail=detail,
                                seconds=round(secs, 3))

    def start_record(self, fid, kind, target, **params):
        self.history.record("fault_start", fault=fid, fault_kind=kind, target=target, params=params)

    def run(self, kind, fid):
        s = self.system
        if kind in cluster.KINDS:
            return cluster.run_fault(self, kind, fid)
        if kind.startswith("kill-") and kind[5:] in ROLES:
            role = kind[5:]
            pause = round(self.rng.uniform(0.0, 3.0), 1)
            self.start_record(fid, kind, role, restart_after=pause)
            pid = s.kill_role(role)
            self.hold(pause)
            s.start_role(role)
            return role, {"restart_after": pause}, f"killed pid {pid}, restarted"
        if kind.startswith("stop-"):
            server = kind[5:]
            secs = self.duration()
            pid = s.server_pid(server)
            if pid is None:
                raise RuntimeError(f"{server} is not running")
            self.start_record(fid, kind, server, seconds=secs, pid=pid)
            os.kill(pid, signal.SIGSTOP)
            try:
                self.hold(secs)
            finally:
                os.kill(pid, signal.SIGCONT)
            return server, {"seconds": secs}, f"SIGSTOP/SIGCONT pid {pid}"
        if kind in ("kill-kafka", "kill-redis"):
            server = kind[5:]
            pause = round(self.rng.uniform(0.0, 5.0), 1) if server == "kafka" else 0.0
            pid = s.server_pid(server)
            if pid is None:
                raise RuntimeError(f"{server} is not running")
            self.start_record(fid, kind, server, pid=pid, restart_after=pause)
            os.kill(pid, signal.SIGKILL)
            self.hold(pause)
            t0 = time.monotonic()
            s.stack_up(server)
            return server, {"restart_after": pause}, f"killed pid {pid}; back after {time.monotonic() - t0:.1f}s"
        if kind == "redis-empty":
            if not self.rebuild_available:
                raise RuntimeError("stocksvr has no `bucket rebuild` (issue 10): redis-empty refused")
            pid = s.server_pid("redis")
            self.start_record(fid, kind, "redis", pid=pid)
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            data = os.path.join(s.stack_dir, "data", "redis")
            shutil.rmtree(data, ignore_errors=True)
            s.stack_up("redis")
            rc, out, err = s.cli("bucket", "rebuild", "--all", "--execute", timeout=600)
            return "redis", {}, f"restarted empty; rebuild exit {rc}: {(out + err)[-300:]}"
        tox, proxy = kind.split("-", 1)
        secs = self.duration()
        name = f"chaos_{tox}"
        if tox == "latency":
            latency = self.rng.randint(200, 2500)
            attrs = {"latency": latency, "jitter": latency // 4}
            toxic_type = "latency"
        elif tox == "reset":
            attrs = {"timeout": 0}
            toxic_type = "reset_peer"
            secs = round(min(secs, 10.0), 1)
        else:
            attrs = {"timeout": 0}
            toxic_type = "timeout"
        self.start_record(fid, kind, proxy, seconds=secs, toxic=toxic_type, attributes=attrs)
        code, body = s.add_toxic(proxy, name, toxic_type, attrs)
        if code not in (200, 201):
            raise RuntimeError(f"adding toxic {toxic_type} to {proxy}: HTTP {code} {body}")
        try:
            self.hold(secs)
        finally:
            s.remove_toxic(proxy, name)
        return proxy, {"seconds": secs, "toxic": toxic_type}, f"{toxic_type} {attrs}"
