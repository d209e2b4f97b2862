"""The load generators of scripts/bench and the parsing of what they print: redis-benchmark
(bare try.lua), sysbench (bare hot-row UPDATE, replayed Try SQL), wrk (Trys over HTTP) and
Kafka's own producer and consumer performance tools."""

import csv
import glob
import io
import json
import os
import re
import resource
import signal
import subprocess
import time

from system import BenchError, tail

HERE = os.path.dirname(os.path.abspath(__file__))
LUA = os.path.join(HERE, "lua")


class Result(dict):
    """rate (per second), p50_ms, p99_ms and whatever else the tool told; gen_cpu_pct is the
    load generator's own CPU (% of one core) over its run."""


def _run(cmd, log, timeout, env=None, stop_when=None):
    """(output, wall seconds, CPU % of one core the tool used) of one load generator run.
    stop_when: polled every 0.5 s; once it returns true the tool gets SIGINT (wrk then stops,
    prints its summary and runs done(), as at the end of its duration)."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
    t0 = time.time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log + ".part", "w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            while True:
                try:
                    p.wait(0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.time() - t0 > timeout:
                    p.kill()
                    p.wait()
                    raise BenchError(f"{cmd[0]} still running after {timeout}s; log {log}")
                if stop_when is not None and stop_when():
                    p.send_signal(signal.SIGINT)
                    stop_when = None
        except BaseException:
            if p.poll() is None:
                p.kill()
                p.wait()
            raise
        out.seek(0)
        text = out.read()
    os.unlink(log + ".part")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - t0
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    with open(log, "a") as f:
        f.write(text)
    if p.returncode != 0:
        raise BenchError(f"{cmd[0]} exited {p.returncode}; log {log}:\n{tail(log)}")
    return text, wall, 100.0 * cpu / wall if wall else 0.0


# ---- redis-benchmark --------------------------------------------------------------------

def redis_benchmark(port, sha, tag, clients, requests, log):
    """EVALSHA of _common.lua + try.lua with a fresh fence key, reservation id and operation id
    per call. redis-benchmark replaces every __rand_int__ with its own 12-digit number below
    -r, which must fit an int (2^31): two in a row make a 24-digit id, so operation ids do
    not collide (a collision would replay, or be refused as an operation id reused)."""
    rnd = "__rand_int____rand_int__"
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-n", str(requests), "-r", "2000000000", "--csv",
           "EVALSHA", sha, "3",
           f"inv:{{{tag}}}:stock", f"inv:{{{tag}}}:reservation:{rnd}", f"inv:{{{tag}}}:op:op_try_{rnd}",
           rnd, f"op_try_{rnd}", "1", "86400000"]
    out, _, cpu = _run(cmd, log, timeout=1800)
    rows = list(csv.reader(io.StringIO(out.strip())))
    data = [r for r in rows if r and r[0].startswith("EVALSHA")]
    if not data:
        raise BenchError(f"redis-benchmark printed no result (an error reply aborts it); log {log}")
    r = dict(zip(rows[0], data[-1], strict=False))
    return Result(gen_cpu_pct=cpu, rate=float(r["rps"]), p50_ms=float(r["p50_latency_ms"]),
                  p99_ms=float(r["p99_latency_ms"]), requests=requests, clients=clients)


# ---- sysbench ---------------------------------------------------------------------------

def sysbench(script, db, threads, seconds, log, extra=()):
    """A sysbench Lua script against db (host, port, user, password, name); the rate is
    events per second, p50/p99 come from the latency histogram."""
    host, port, user, password, name = db
    cmd = ["sysbench", os.path.join(LUA, script), "--db-driver=mysql", f"--mysql-host={host}",
           f"--mysql-port={port}", f"--mysql-user={user}", f"--mysql-password={password}",
           f"--mysql-db={name}", f"--threads={threads}", f"--time={seconds}",
           "--percentile=99", "--histogram=on", "--report-interval=0", *extra, "run"]
    out, _, cpu = _run(cmd, log, timeout=seconds + 300)
    events = _num(r"total number of events:\s+(\d+)", out)
    elapsed = _num(r"total time:\s+([\d.]+)s", out)
    errors = _num(r"ignored errors:\s+(\d+)", out, default=0)
    hist = [(float(v), int(c)) for v, c in re.findall(r"^\s*([\d.]+) \|\**\s+(\d+)\s*$", out, re.M)]
    return Result(gen_cpu_pct=cpu, rate=events / elapsed if elapsed else 0.0, events=int(events), seconds=elapsed,
                  p50_ms=_hist_pct(hist, 50), p99_ms=_hist_pct(hist, 99), errors=int(errors),
                  threads=threads)


def _num(pattern, text, default=None):
    m = re.search(pattern, text)
    if not m:
        if default is not None:
            return default
        raise BenchError(f"sysbench output lacks /{pattern}/")
    return float(m.group(1))


def _hist_pct(hist, pct):
    total = sum(c for _, c in hist)
    if not total:
        return None
    want, seen = total * pct / 100.0, 0
    for value, count in hist:
        seen += count
        if seen >= want:
            return value
    return hist[-1][0]


# ---- wrk --------------------------------------------------------------------------------

def wrk(url, conns, seconds, logdir, mode, prefix, merchant, dish_base, dishes, log,
        quota=0, timeout_s=10, stop_when=None, env=None):
    """Trys through HTTP (tests/bench/lua/wrk_try.lua). Returns the wrk summary plus every
    response's (status, id, outcome) from the per-thread logs. wrk's main thread sleeps the
    whole duration even when every thread stopped at its quota, so a quota run passes
    stop_when (e.g. "the Trys are in the database") to end it early with SIGINT. env: wrk's
    environment (WRK_AUTHORIZATION: a caller token for a secured listener)."""
    os.makedirs(logdir, exist_ok=True)
    threads = max(1, min(2, conns))
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--timeout",
           f"{timeout_s}s", "-s", os.path.join(LUA, "wrk_try.lua"), url, "--", mode, str(prefix),
           str(merchant), str(dish_base), str(dishes), logdir, str(quota)]
    out, wall, cpu = _run(cmd, log, timeout=seconds + 600, stop_when=stop_when, env=env)
    line = [x for x in out.splitlines() if x.startswith("WRKJSON ")]
    if not line:
        raise BenchError(f"wrk printed no summary; log {log}")
    s = json.loads(line[-1][len("WRKJSON "):])
    responses = []
    for path in sorted(glob.glob(os.path.join(logdir, "t*.log"))):
        with open(path) as f:
            for row in f:
                parts = row.split()
                if len(parts) == 3:
                    responses.append((int(parts[0]), parts[1], parts[2]))
    secs = s["duration_us"] / 1e6
    return Result(gen_cpu_pct=cpu, rate=s["requests"] / secs if secs else 0.0, p50_ms=s["p50_us"] / 1000.0,
                  p99_ms=s["p99_us"] / 1000.0, p90_ms=s["p90_us"] / 1000.0,
                  max_ms=s["lat_max_us"] / 1000.0, requests=s["requests"], seconds=secs,
                  ok2xx=s["ok2xx"], non2xx=s["non2xx"], timeouts=s["timeouts"],
                  socket_errors=s["connect_errors"] + s["read_errors"] + s["write_errors"],
                  conns=conns, responses=responses, wall=wall)


# ---- Kafka's own tools ------------------------------------------------------------------

def _kafka_java(kafka_home, log4j, cls, args):
    return ["java", "-Xms64m", "-Xmx512m", f"-Dlog4j2.configurationFile={log4j}",
            "-cp", os.path.join(kafka_home, "lib", "*"), cls, *args]


def kafka_producer_perf(kafka_home, log4j, brokers, topic, records, size, log):
    """org.apache.kafka.tools.ProducerPerformance (kafka-producer-perf-test.sh) with the
    relay's delivery settings: idempotent, acks=all, linger.ms=5."""
    cmd = _kafka_java(kafka_home, log4j, "org.apache.kafka.tools.ProducerPerformance", [
        "--topic", topic, "--num-records", str(records), "--record-size", str(size),
        "--throughput", "-1", "--producer-props", f"bootstrap.servers={brokers}", "acks=all",
        "enable.idempotence=true", "linger.ms=5"])
    out, _, cpu = _run(cmd, log, timeout=900)
    m = re.findall(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg "
                   r"latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th", out)
    if not m:
        raise BenchError(f"ProducerPerformance printed no summary; log {log}")
    sent, rate, mb, _avg, _mx, p50, _p95, p99 = m[-1]
    return Result(gen_cpu_pct=cpu, rate=float(rate), records=int(sent), mb_s=float(mb), p50_ms=float(p50),
                  p99_ms=float(p99), size=size)


def kafka_consumer_perf(kafka_home, log4j, brokers, topic, records, group, log):
    """org.apache.kafka.tools.ConsumerPerformance (kafka-consumer-perf-test.sh) from the
    earliest offset; the rate is fetch.nMsg.sec (without the group join)."""
    cmd = _kafka_java(kafka_home, log4j, "org.apache.kafka.tools.ConsumerPerformance", [
        "--bootstrap-server", brokers, "--topic", topic, "--messages", str(records),
        "--group", group, "--timeout", "60000"])
    out, _, cpu = _run(cmd, log, timeout=900)
    lines = [x for x in out.splitlines() if x.strip()]
    idx = [i for i, x in enumerate(lines) if x.startswith("start.time")]
    if not idx or idx[-1] + 1 >= len(lines):
        raise BenchError(f"ConsumerPerformance printed no summary; log {log}")
    keys = [k.strip() for k in lines[idx[-1]].split(",")]
    vals = [v.strip() for v in lines[idx[-1] + 1].split(",")]
    r = dict(zip(keys, vals, strict=False))
    return Result(gen_cpu_pct=cpu, rate=float(r["fetch.nMsg.sec"]), overall_rate=float(r["nMsg.sec"]),
                  records=int(float(r["data.consumed.in.nMsg"])), mb=float(r["data.consumed.in.MB"]),
                  rebalance_ms=float(r.get("rebalance.time.ms", 0)))
