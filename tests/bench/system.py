"""What a bench run talks to: its private MariaDB and Redis (scripts/stack with a port base of
its own), the stocksvr roles it starts, and a sampler of CPU time and resident memory.

Every process here is started by the bench and stopped by its own pid; nothing of the shared
stack is ever stopped, signalled or written to except the bench's own Kafka topics.
"""

import os
import re
import threading
import time

import pymysql

from stocksvr_harness import HarnessError, procs
from stocksvr_harness import http as http_mod
from stocksvr_harness.stack import Stack
from stocksvr_harness.wait import WaitTimeout

CLK_TCK = os.sysconf("SC_CLK_TCK")
tail = procs.tail


class BenchError(HarnessError):
    """A step of the bench could not run; the message says which and where its log is."""


def run(cmd, log, env=None, timeout=600, check=True, cwd=None):
    """Runs cmd with its output appended to log; returns (returncode, output)."""
    return procs.run(cmd, log, env=env, timeout=timeout, check=check, cwd=cwd, error=BenchError)


class PrivateStack:
    """MariaDB and Redis of the bench's own (scripts/stack, STACK_PORT_BASE): the statement
    counts (SHOW GLOBAL STATUS), the general log and the Redis command counts are then the
    bench's alone, and the 64-client baselines never slow down the suite's shared servers."""

    SERVICES = "mariadb redis"

    def __init__(self, repo, stack_dir, base, cache, logs):
        self.stack = Stack(stack_dir, base, logs, cache=cache or None, repo=repo, STACK_SERVICES=self.SERVICES)
        self.mysql_port = self.stack.port("mariadb")
        self.redis_port = self.stack.port("redis")
        self.password = self.stack.env.get("STACK_DB_PASSWORD", "stocksvr")

    def up(self):
        self.stack.up()

    def down(self):
        self.stack.down(*self.SERVICES.split(), check=True)

    def pid(self, name):
        pid = self.stack.pid(name)
        if pid is None:
            raise BenchError(f"scripts/stack pid {name}: not running (log {self.stack.logs}/stack.log)")
        return pid

    def mysql_url(self, database):
        return f"mysql://stocksvr:{self.password}@127.0.0.1:{self.mysql_port}/{database}"

    def redis_url(self):
        return f"redis://127.0.0.1:{self.redis_port}/"

    def db(self, database=None):
        return Db("127.0.0.1", self.mysql_port, "stocksvr", self.password, database)


class Db:
    """A small autocommit PyMySQL wrapper; `count` is the number of statements it sent, so a
    Questions delta can leave the bench's own statements out."""

    def __init__(self, host, port, user, password, database=None):
        self.count = 0
        self.conn = pymysql.connect(host=host, port=port, user=user, password=password,
                                    database=database, autocommit=True, connect_timeout=10,
                                    read_timeout=600, write_timeout=600, charset="utf8mb4")

    def q(self, sql, args=None):
        self.count += 1
        with self.conn.cursor() as c:
            c.execute(sql, args)
            return c.fetchall()

    def one(self, sql, args=None):
        rows = self.q(sql, args)
        return rows[0][0] if rows else None

    def status(self):
        """SHOW GLOBAL STATUS as numbers (this statement counts itself in Questions)."""
        out = {}
        for k, v in self.q("SHOW GLOBAL STATUS"):
            try:
                out[k] = int(v)
            except (TypeError, ValueError):
                pass
        return out

    def close(self):
        self.conn.close()


def http(method, url, body=None, headers=None, timeout=30):
    """(status, body text) of one request; connection errors raise."""
    return http_mod.call(method, url, body, headers, timeout)


def parse_metrics(text):
    """Prometheus text -> {(name, frozenset(labels)): value}."""
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = line_re.match(line)
        if not m:
            continue
        labels = frozenset(label_re.findall(m.group(3) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            pass
    return out


def metric_sum(metrics, name, **want):
    """Sum of every series of name whose labels include want."""
    total = 0.0
    for (n, labels), v in metrics.items():
        if n == name and all((k, str(val)) in labels for k, val in want.items()):
            total += v
    return total


class Role:
    """One stocksvr process (`all`, `order-lifecycle`, `outbox-relay`, `projector`)."""

    def __init__(self, binary, sub, env, listen, log, cwd):
        self.binary, self.sub, self.env, self.listen, self.log, self.cwd = binary, sub, env, listen, log, cwd
        self.child = procs.Child([binary, sub], log, env=dict(env, STOCKSVR__HTTP__LISTEN=listen), cwd=cwd)

    @property
    def proc(self):
        return self.child.proc

    @property
    def pid(self):
        return self.child.pid

    def start(self):
        self.child.start()
        return self

    def url(self, path):
        return f"http://{self.listen}{path}"

    def wait_ready(self, timeout=180):
        try:
            http_mod.wait_http(self.url("/readyz"), timeout, f"stocksvr {self.sub}", child=self.child, interval=0.2)
        except (WaitTimeout, procs.Exited) as e:
            raise BenchError(f"{e}; log {self.log}:\n{tail(self.log)}") from e
        return self

    def metrics(self):
        return parse_metrics(http("GET", self.url("/metrics"), timeout=10)[1])

    def stop(self, timeout=30):
        """SIGTERM (it drains and commits), SIGKILL after timeout. Returns the exit code."""
        if self.proc is None:
            return None
        return self.child.stop(timeout)[0]


def read_proc(pid):
    """(cpu ticks user+system from /proc/PID/stat, VmRSS kB from /proc/PID/status) of pid, or
    None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])
        rss_kb = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                    break
        return ticks, rss_kb
    except (OSError, ValueError, IndexError):
        return None


def read_cpu():
    """The machine's cpu line of /proc/stat: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


class Sampler(threading.Thread):
    """Every second: CPU ticks and VmRSS of each tracked process, and the machine's CPU split."""

    def __init__(self, interval=1.0):
        super().__init__(name="sampler", daemon=True)
        self.interval = interval
        self.pids = {}
        self.samples = []  # (t, {name: (ticks, rss_kb)}, cpu fields)
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def track(self, name, pid):
        with self.lock:
            self.pids[name] = pid

    def untrack(self, name):
        with self.lock:
            self.pids.pop(name, None)

    def sample(self):
        with self.lock:
            pids = dict(self.pids)
        procs = {}
        for name, pid in pids.items():
            r = read_proc(pid)
            if r is not None:
                procs[name] = r
        s = (time.time(), procs, read_cpu())
        with self.lock:
            self.samples.append(s)
        return s

    def run(self):
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.interval)

    def stop(self):
        self.halt.set()

    def window(self, t0, t1):
        """CPU (% of one core, averaged) and RSS (max, last; MB) per process between t0 and
        t1, and the machine's CPU split in % of all cores."""
        with self.lock:
            win = [s for s in self.samples if t0 - 0.5 <= s[0] <= t1 + 0.5]
        out = {"procs": {}, "machine": {}}
        if len(win) < 2:
            return out
        names = set().union(*(s[1].keys() for s in win))
        for name in names:
            seen = [(s[0], s[1][name]) for s in win if name in s[1]]
            # A process stopped just before the phase (the relay before Kafka's producer
            # tool) still shows in the samples of the half second before it: its CPU there
            # is not the phase's.
            if not any(t >= t0 for t, _ in seen):
                continue
            (ta, (ca, _)), (tb, (cb, rss_last)) = seen[0], seen[-1]
            cpu = 100.0 * (cb - ca) / CLK_TCK / (tb - ta) if tb > ta else None
            out["procs"][name] = {
                "cpu_pct": cpu,
                "rss_max_mb": max(r for _, (_, r) in seen) / 1024.0,
                "rss_last_mb": rss_last / 1024.0,
            }
        a, b = win[0][2], win[-1][2]
        d = [y - x for x, y in zip(a, b, strict=True)]
        total = sum(d) or 1
        keys = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
        out["machine"] = {k: 100.0 * v / total for k, v in zip(keys, d, strict=True)}
        return out

    def rss_series(self, name):
        with self.lock:
            return [(s[0], s[1][name][1] / 1024.0) for s in self.samples if name in s[1]]


class StatusSampler(threading.Thread):
    """Every second: the MariaDB counters that show a write stall (page flushing, fsyncs, the
    checkpoint age, row-lock waits, the purge's history list), to line them up with the
    seconds that held slow orders. Its own connection: one statement a second."""

    KEYS = ("Questions", "Com_commit", "Innodb_buffer_pool_pages_flushed", "Innodb_buffer_pool_pages_dirty",
            "Innodb_data_fsyncs", "Innodb_os_log_fsyncs", "Innodb_checkpoint_age", "Innodb_history_list_length",
            "Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_log_waits", "Innodb_rows_read",
            "Innodb_buffer_pool_wait_free", "Threads_running")
    LEVELS = ("Innodb_buffer_pool_pages_dirty", "Innodb_checkpoint_age", "Innodb_history_list_length",
              "Threads_running")

    # Redis, prefixed "redis:": commands, forks (an AOF rewrite forks; the copy-on-write
    # faults slow the main thread), delayed AOF fsyncs, and calls per command.
    REDIS_LEVELS = ("redis:aof_rewrite_in_progress",)

    def __init__(self, db, redis_client=None, interval=1.0):
        super().__init__(name="status-sampler", daemon=True)
        self.db = db
        self.redis = redis_client
        self.interval = interval
        self.samples = []  # (t, {key: value})
        self.halt = threading.Event()

    def _redis(self):
        if self.redis is None:
            return {}
        info = self.redis.info("all")
        out = {"redis:commands": info.get("total_commands_processed", 0),
               "redis:forks": info.get("total_forks", 0),
               "redis:aof_delayed_fsync": info.get("aof_delayed_fsync", 0),
               "redis:aof_rewrite_in_progress": info.get("aof_rewrite_in_progress", 0)}
        for k, v in info.items():
            if k.startswith("cmdstat_") and isinstance(v, dict):
                out["redis:" + k[len("cmdstat_"):]] = v.get("calls", 0)
        return out

    def run(self):
        while not self.halt.is_set():
            try:
                s = self.db.status()
                row = {k: s.get(k, 0) for k in self.KEYS}
                row.update(self._redis())
            except Exception:  # a lost connection ends the timeline, not the bench
                return
            self.samples.append((time.time(), row))
            self.halt.wait(self.interval)

    def stop(self):
        self.halt.set()
        self.join(timeout=5)
        self.db.close()

    def second(self, t):
        """Counter deltas per second across [t, t+1] (levels as the highest sample), or None."""
        before = [s for s in self.samples if s[0] <= t + 0.2]
        after = [s for s in self.samples if s[0] >= t + 0.8]
        if not before or not after:
            return None
        (ta, a), (tb, b) = before[-1], after[0]
        secs = max(tb - ta, 0.001)
        inside = [s[1] for s in self.samples if ta <= s[0] <= tb]
        levels = self.LEVELS + self.REDIS_LEVELS
        out = {k: (b[k] - a.get(k, 0)) / secs for k in b if k not in levels}
        out.update({k: max(s.get(k, 0) for s in inside) for k in levels if k in b})
        return out
