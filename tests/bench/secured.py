#!/usr/bin/env python3
"""scripts/bench --secure: the Try through HTTP with every connection secured beside the same
with none, in one run on one machine state (issue 47), and how many connections each side
opens per minute under that steady load, read from the servers' own counters.

Two private stacks run side by side (scripts/stack: plaintext on --port-base B, secure with
`up --secure` on B+300), each with its database, topics, schemas and one hot dish, and a
`stocksvr all` of the same binary: plaintext as the dev stack runs it; secure with the
settings `scripts/stack env` prints (Kafka SASL_SSL + SCRAM-SHA-512 + client certificate with
only the ACLs `stocksvr acls print` prints, MariaDB VERIFY_IDENTITY as the DML-only user, Redis
rediss:// as its ACL user, the registry over HTTPS with a bearer token) and its own listener on
HTTPS with a caller token. wrk loads the hot dish at 64 connections, the sides alternated
(P S, S P, ...), each load after a warm-up and once the side's outbox is empty; each side's
median is compared with the targets (secured >= 0.8x plaintext throughput, p99 <= 1.25x).
Around each measured load the servers' counters are read: MariaDB `Connections`, Redis
`total_connections_received`, and Kafka's socket-server `connection-creation-total` over JMX
(opened on the broker for the run with jcmd; left out, and said, when that fails).

Prints one table and writes it to bench-results/<stamp>-secure/table.txt (logs beside it).
"""

import argparse
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import pymysql
import redis as redis_lib

import loads
from stocksvr_harness import REPO, codes, procs
from stocksvr_harness.secure import PlainClients, SecureClients, stack_exports
from stocksvr_harness.stack import Stack, without_stocksvr_settings
from stocksvr_harness.wait import wait_until

MERCHANT, DISH = 901, 901001
TARGET_RATE, TARGET_P99 = 0.8, 1.25


def log(msg):
    print(f"bench --secure {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


class Side:
    """One stack and the `stocksvr all` measured on it."""

    def __init__(self, name, secure, base, out, a):
        self.name, self.secure, self.base, self.a = name, secure, base, a
        self.logs = os.path.join(out, "logs", name)
        os.makedirs(self.logs, exist_ok=True)
        self.stack = Stack(os.path.join(out, "stacks", name), base, self.logs, cache=a.stack_cache or None,
                           STACK_SECURE="1" if secure else "0", STACK_KAFKA_BROKERS="1", STACK_REDIS_CLUSTER="0",
                           STACK_KAFKA_PROXIED="0")
        self.child = None
        self.counter_conn = None
        self.wrk_env = dict(os.environ)
        self.kafka_jmx = None
        self.runs = []

    # ---- setup --------------------------------------------------------------------------

    def up(self):
        t0 = time.time()
        self.stack.up("kafka", "registry", "mariadb", "redis", timeout=900)
        self.exports = stack_exports(self.stack.env)
        self.clients = SecureClients(self.exports) if self.secure else PlainClients()
        log(f"{self.name}: stack up in {time.time() - t0:.0f} s")

    def cli(self, *args, env=None):
        p = subprocess.run([self.a.bin, *args], env={**self.env, **(env or {})}, cwd=REPO, capture_output=True,
                           text=True, timeout=600)
        with open(os.path.join(self.logs, "cli.log"), "a") as f:
            f.write(f"\n$ stocksvr {' '.join(args)}\n-> {p.returncode}\n{p.stdout}{p.stderr}")
        if p.returncode != 0:
            raise RuntimeError(f"{self.name}: stocksvr {' '.join(args)} failed: {(p.stdout + p.stderr)[-400:]}")
        return p.stdout

    def prepare(self):
        self.port = self.base + 88
        self.env = {**without_stocksvr_settings(os.environ), **self.clients.service_env(),
                    "STOCKSVR__HTTP__LISTEN": f"127.0.0.1:{self.port}", "RUST_LOG": "warn"}
        if not self.secure:
            self.env.update({k: v for k, v in self.exports.items() if k.startswith("STOCKSVR__")})
        self.cli("migrate", env=self.clients.mysql_admin_env())
        if self.secure:
            acls = os.path.join(self.logs, "acls.txt")
            with open(acls, "w") as f:
                f.write(self.cli("acls", "print", "--role", "all"))
            self.stack.script("stack", "acls", "apply", acls)
        self.cli("topics", "apply", env=self.clients.kafka_principal_env("TOPICS_ADMIN"))
        self.cli("schemas", "register")
        self.cli("bucket", "init", "--merchant-id", str(MERCHANT), "--dish-id", str(DISH), "--total", "100000000",
                 "--timezone", "UTC")
        self.scheme = "http"
        if self.secure:
            self._secure_listener()
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.mysql = dict(host="127.0.0.1", port=self.base + 7, database="stocksvr", autocommit=True,
                          connect_timeout=5, **self.clients.mysql())
        self.redis = redis_lib.Redis(host="127.0.0.1", port=self.base + 80, socket_timeout=5, **self.clients.redis())
        self.kafka_jmx = KafkaJmx(self.stack.pid("kafka"), self.base + 97, self.a.kafka_home, self.logs)

    def _secure_listener(self):
        """HTTPS with the stack's certificate for stocksvr, one caller by bearer token (made
        by `stocksvr token new`; only its SHA-256 is in the clients file), and the registry
        by bearer token too."""
        made = self.cli("token", "new", "--name", "bench", "--scope", "api", "--scope", "admin")
        lines = made.splitlines()
        token = next(line for line in lines if line.startswith("stocksvr_"))
        marker = next(i for i, line in enumerate(lines) if line.startswith("a line of http.auth.clients_file"))
        clients = os.path.join(self.logs, "clients")
        with open(os.open(clients, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(lines[marker + 1] + "\n")
        self.env.update({"STOCKSVR__HTTP__TLS__CERT_FILE": self.exports["STACK_HTTP_TLS_CERT_FILE"],
                         "STOCKSVR__HTTP__TLS__KEY_FILE": self.exports["STACK_HTTP_TLS_KEY_FILE"],
                         "STOCKSVR__HTTP__AUTH__CLIENTS_FILE": clients,
                         "STOCKSVR__REGISTRY__TOKEN_FILE": self.exports["STACK_REGISTRY_TOKEN_FILE"]})
        for key in ("STOCKSVR__REGISTRY__USERNAME", "STOCKSVR__REGISTRY__PASSWORD_FILE"):
            self.env.pop(key, None)
        self.wrk_env["WRK_AUTHORIZATION"] = f"Bearer {token}"
        self.scheme = "https"

    def start(self):
        self.child = procs.Child([self.a.bin, "all"], os.path.join(self.logs, "stocksvr-all.log"), env=self.env,
                                 cwd=REPO, new_session=True).start()
        ctx = ssl.create_default_context(cafile=self.clients.ca) if self.secure else None

        def ready():
            self.child.check_running("before /readyz answered 200")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=5, context=ctx) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(ready, 180, f"{self.name}: stocksvr all ready", interval=0.5)

    def stop(self):
        if self.counter_conn is not None:
            self.counter_conn.close()
            self.counter_conn = None
        if self.child is not None:
            self.child.stop()
            self.child = None

    # ---- measuring ----------------------------------------------------------------------

    def outbox_empty(self):
        conn = pymysql.connect(**self.mysql)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) {codes.OUTBOX_UNSENT_FROM}")
                return cur.fetchone()[0] == 0
        finally:
            conn.close()

    def counters(self):
        """The servers' counts of connections opened so far (None: not readable). The bench's
        own MariaDB and Redis connections for these reads are kept open, so a load's count is
        the service's alone."""
        if self.counter_conn is None:
            self.counter_conn = pymysql.connect(**self.mysql)
        with self.counter_conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Connections'")
            mysql = int(cur.fetchone()[1])
        redis = int(self.redis.info("stats")["total_connections_received"])
        return {"mariadb": mysql, "redis": redis, "kafka": self.kafka_jmx.connections(), "t": time.time()}

    def load(self, rnd, secs, prefix):
        wait_until(self.outbox_empty, 300, f"{self.name}: the outbox to empty", interval=1.0)
        logdir = os.path.join(self.logs, f"wrk-{rnd}")
        wrk_log = os.path.join(self.logs, "wrk.log")
        loads.wrk(self.url, 64, self.a.warm_secs, logdir + "-warm", "single", prefix, MERCHANT, DISH, 1, wrk_log,
                  env=self.wrk_env)
        wait_until(self.outbox_empty, 300, f"{self.name}: the outbox to empty", interval=1.0)
        before = self.counters()
        r = loads.wrk(self.url, 64, secs, logdir, "single", prefix + 1, MERCHANT, DISH, 1, wrk_log, env=self.wrk_env)
        after = self.counters()
        minutes = (after["t"] - before["t"]) / 60.0
        per_min = {k: (after[k] - before[k]) / minutes if after[k] is not None and before[k] is not None else None
                   for k in ("mariadb", "redis", "kafka")}
        self.child.check_running(f"after round {rnd}")
        run = {"rate": r["rate"], "p99_ms": r["p99_ms"], "p50_ms": r["p50_ms"], "non2xx": r["non2xx"],
               "errors": r["socket_errors"] + r["timeouts"], "per_min": per_min}
        self.runs.append(run)
        log(f"{self.name} round {rnd}: {r['rate']:,.0f} Trys/s, p99 {r['p99_ms']:.1f} ms, non-2xx {r['non2xx']}, "
            f"connections opened per minute {fmt_conns(per_min)}")
        return run


class KafkaJmx:
    """Kafka's `connection-creation-total` summed over the broker's listeners, read with
    Kafka's JmxTool from a JMX connector jcmd opens on the running broker (loopback only,
    for the run)."""

    def __init__(self, pid, port, kafka_home, logs):
        self.url = f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{port}/jmxrmi"
        self.kafka_home, self.log = kafka_home, os.path.join(logs, "kafka-jmx.log")
        self.ok = False
        if not pid or not kafka_home or not shutil.which("jcmd"):
            return
        p = subprocess.run(["jcmd", str(pid), "ManagementAgent.start", f"jmxremote.port={port}",
                            f"jmxremote.rmi.port={port}", "jmxremote.authenticate=false", "jmxremote.ssl=false",
                            "jmxremote.host=127.0.0.1"], capture_output=True, text=True, timeout=60)
        with open(self.log, "a") as f:
            f.write(p.stdout + p.stderr)
        self.ok = p.returncode == 0 and self.connections() is not None

    def connections(self):
        if not self.kafka_home:
            return None
        cmd = ["java", "-Xmx128m", "-cp", os.path.join(self.kafka_home, "lib", "*"), "org.apache.kafka.tools.JmxTool",
               "--jmx-url", self.url, "--object-name", "kafka.server:type=socket-server-metrics,*",
               "--attributes", "connection-creation-total", "--one-time", "true", "--report-format", "properties"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        with open(self.log, "a") as f:
            f.write(p.stdout[-2000:] + p.stderr[-2000:])
        values = [float(v) for v in re.findall(r"connection-creation-total=([0-9.Ee+]+)", p.stdout)]
        return sum(values) if p.returncode == 0 and values else None


def fmt_conns(per_min):
    return ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} n/a" for k, v in per_min.items())


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(sides, a):
    rows = []
    for side in sides:
        rate = median([r["rate"] for r in side.runs])
        p99 = median([r["p99_ms"] for r in side.runs])
        conns = {k: median([r["per_min"][k] for r in side.runs]) for k in ("mariadb", "redis", "kafka")}
        rows.append((side, rate, p99, conns))
    (_, prate, pp99, _), (_, srate, sp99, _) = rows
    out = [f"stocksvr bench --secure, {time.strftime('%Y-%m-%d %H:%M')} UTC, binary {a.bin}",
           f"{os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.1f}; hot dish, 64 connections, "
           f"{a.rounds} rounds of {a.secs} s per side (alternated), medians", ""]
    for side, rate, p99, conns in rows:
        what = ("secured (Kafka SASL_SSL+SCRAM+mTLS, MariaDB VERIFY_IDENTITY, Redis rediss ACL user, registry "
                "HTTPS+bearer, API HTTPS+caller token)" if side.secure else "plaintext")
        out.append(f"{side.name:9} {rate:10,.0f} Trys/s  p99 {p99:7.1f} ms   {what}")
        out.append(f"{'':9} rounds " + " / ".join(f"{r['rate']:,.0f}" for r in side.runs) + " per s; p99 "
                   + " / ".join(f"{r['p99_ms']:.1f}" for r in side.runs) + " ms; non-2xx "
                   + str(sum(r["non2xx"] for r in side.runs)) + ", socket errors/timeouts "
                   + str(sum(r["errors"] for r in side.runs)))
        out.append(f"{'':9} connections opened per minute under that load: {fmt_conns(conns)}")
    rate_ratio = srate / prate if prate else None
    p99_ratio = sp99 / pp99 if pp99 else None
    out.append("")
    out.append(f"secured / plaintext throughput {rate_ratio:.2f} (target >= {TARGET_RATE}: "
               f"{'met' if rate_ratio is not None and rate_ratio >= TARGET_RATE else 'NOT met'})")
    out.append(f"secured / plaintext p99        {p99_ratio:.2f} (target <= {TARGET_P99}: "
               f"{'met' if p99_ratio is not None and p99_ratio <= TARGET_P99 else 'NOT met'})")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--kafka-home", default="")
    ap.add_argument("--stack-cache", default=os.environ.get("STACK_CACHE", ""))
    ap.add_argument("--port-base", type=int, default=25000, help="plaintext stack on B, secure on B+300")
    ap.add_argument("--results", default=os.path.join(REPO, "bench-results"))
    ap.add_argument("--rounds", type=int, default=2, help="measured loads per side (default 2)")
    ap.add_argument("--secs", type=int, default=30, help="seconds per measured load (default 30)")
    ap.add_argument("--quick", action="store_true", help="1 round of 10 s per side")
    ap.add_argument("--keep", action="store_true", help="leave both stacks running")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.secs = 1, 10
    a.warm_secs = 5
    a.bin = os.path.abspath(a.bin)
    out = os.path.join(a.results, time.strftime("%Y%m%d-%H%M%S") + "-secure")
    os.makedirs(out, exist_ok=True)
    sides = [Side("plaintext", False, a.port_base, out, a), Side("secured", True, a.port_base + 300, out, a)]
    try:
        for side in sides:
            side.up()
            side.prepare()
            side.start()
        for side in sides:
            if side.kafka_jmx is None or not side.kafka_jmx.ok:
                log(f"{side.name}: Kafka's connection counter is not readable over JMX (see kafka-jmx.log)")
        for rnd in range(1, a.rounds + 1):
            order = sides if rnd % 2 else list(reversed(sides))
            for side in order:
                side.load(rnd, a.secs, prefix=10 + 2 * (rnd - 1))
        text = table(sides, a)
    finally:
        for side in sides:
            side.stop()
            if not a.keep:
                side.stack.down()
    print("\n" + text, flush=True)
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(text + "\n")
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
