#!/usr/bin/env python3
"""scripts/bench's orchestrator (scripts/bench installs the tools and the venv, builds or takes
the binary, starts the shared Kafka and registry, then runs this). See tests/bench/README.md.

Parts, in this order, all in one run:
  1. the SQL of a Try (stocksvr order-lifecycle alone; MariaDB general log), statements per Try;
  2. baselines without stocksvr: try.lua via redis-benchmark, a hot-row UPDATE and the Try's
     own statements replayed via sysbench;
  3. Trys through HTTP with wrk against stocksvr all: hot dish, cold dishes, order-level, and
     the concurrency sweep on the hot dish;
  4. a backlog of Trys made with no relay running, drained by the relay alone and booked by the
     projector alone, next to Kafka's producer and consumer tools; a fresh group catching up;
  5. OrderCreated -> CONFIRMED at a steady rate; 6. idle cost; then the durability check and
  7. what the run's data costs to keep (Redis and MariaDB bytes per bucket and reservation).
"""

import argparse
import fcntl
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import parts
import parts_pipeline
import parts_retries
import report
import storage
from bench import REPO, Bench, dump_json, settings_env
from stocksvr_harness import HarnessError
from system import BenchError


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every part briefly (a smoke run of a few minutes)")
    ap.add_argument("--bin", required=True, help="stocksvr binary (a release build)")
    ap.add_argument("--results", default=os.path.join(REPO, "bench-results"))
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("BENCH_PORT_BASE", "25000")),
                    help="private MariaDB on B+7, Redis on B+80, stocksvr on B+88..B+90 (default 25000)")
    ap.add_argument("--private-stack-dir", default=os.path.join(REPO, "bench-results", ".stack"))
    ap.add_argument("--stack-cache", default=os.environ.get("STACK_CACHE", ""))
    ap.add_argument("--brokers", default=os.environ.get("STOCKSVR__KAFKA__BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get("STOCKSVR__REGISTRY__URL",
                                                         "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--kafka-home", required=True, help="Kafka's jars (lib/) for its perf tools")
    ap.add_argument("--kafka-pid", type=int, default=0, help="the broker's pid, to show its CPU")
    ap.add_argument("--keep", action="store_true", help="keep the database, topics and private stack")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a stocksvr setting for every process the bench starts (reservation.try_group_max=32)")
    ap.add_argument("--only", choices=["http", "pipeline"],
                    help="http: only part 3 (Trys through HTTP: hot, cold, order-level, the sweep) and the "
                         "durability check, for a quick before/after of the Try path; pipeline: only parts 4 and 5 "
                         "(the backlog drained by the relay and the projector, the fresh group, the orders) and the "
                         "durability check; the ratios to the baselines need a full run")
    ap.add_argument("--against", metavar="BIN",
                    help="an A/B run instead: only the hot-dish Try at 64 connections, --bin (A) and this "
                         "binary (B) alternated for --rounds rounds, then the durability check; prints each "
                         "side's median and B/A")
    ap.add_argument("--against-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for B only (with or without --against: B is then --bin with it)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of an A/B run (default 3)")
    a = ap.parse_args()
    ab = bool(a.against or a.against_set)
    if ab and a.only:
        ap.error("--against/--against-set is a run of its own; leave out --only")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        against_env = settings_env(a.against_set)
    except BenchError as e:
        ap.error(str(e))
    # Two runs at once share the private stack (its ports and data folder) and the machine:
    # the second one's servers fail to bind and its cleanup stops the first one's MariaDB
    # mid-run, and both runs' figures are worthless. One run at a time, refused plainly.
    os.makedirs(os.path.dirname(os.path.abspath(a.private_stack_dir)), exist_ok=True)
    # Held open (and locked) for the whole run: the process exit releases it.
    lock = open(os.path.abspath(a.private_stack_dir) + ".lock", "a")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"bench: another run is using {a.private_stack_dir} (lock {lock.name}); wait for it to "
              f"finish, or give this one its own --private-stack-dir and --port-base", file=sys.stderr)
        return 2
    a.log4j = os.path.join(REPO, "stack", "kafka", "tools-log4j2.properties")
    a.bin = os.path.abspath(a.bin)
    b = Bench(a)
    if ab:
        b.mode = "A/B"
    # What the table calls the run: its mode, or the part --only chose (not a full run).
    b.label = (f"{b.mode} run" if ab or not a.only
               else ("quick " if a.quick else "") + f"run of --only {a.only}")
    b.all = None
    b.group_prefix = b.ns
    # The revision the measured binary was built from: read now, before a run of many minutes
    # in which the checkout may move on.
    b.git_rev = git_rev()
    b.log(f"{b.label}; results in {b.out}")
    error = None
    try:
        b.setup()
        if ab:
            parts.part_ab(b, a.against and os.path.abspath(a.against), against_env, a.rounds)
            parts_pipeline.part_durability(b)
        elif a.only == "http":
            parts.part_http(b, init=True)
            parts_retries.part_retries(b)
            parts_pipeline.part_durability(b)
        elif a.only == "pipeline":
            parts.start_all(b, init=True)
            parts_pipeline.part_pipeline(b)
            parts_pipeline.part_orders(b)
            parts_pipeline.part_durability(b)
        else:
            parts.part_capture(b)
            parts.part_bare(b)
            parts.part_http(b)
            parts_retries.part_retries(b)
            parts_pipeline.part_pipeline(b)
            parts_pipeline.part_orders(b)
            parts_pipeline.part_idle(b)
            parts_pipeline.part_durability(b)
            storage.part_storage(b)
    except (HarnessError, subprocess.SubprocessError, OSError) as e:  # BenchError is one
        error = e
        traceback.print_exc()
    except KeyboardInterrupt as e:
        error = e
    finally:
        b.cleanup()
    write(b, error)
    return 0 if error is None and b.durable else 1


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        return rev or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _baseline_ratios(fig):
    fig.ratio("ratio_try_update", "Try (hot, HTTP, 64) / bare hot-row UPDATE (64)", "try_http_hot", "bare_update",
              "target >= 1, aim 2")
    fig.ratio("ratio_try_lua", "Try (hot, HTTP, 64) / bare try.lua (64)", "try_http_hot", "bare_lua")
    fig.ratio("ratio_try_sql", "Try (hot, HTTP, 64) / the Try's SQL replayed (64)", "try_http_hot", "try_sql_64")
    fig.ratio("ratio_relay_kafka", "relay / Kafka producer tool", "relay", "kafka_producer", "aim ~0.5")
    fig.ratio("ratio_projector_kafka", "projector / Kafka consumer tool", "projector", "kafka_consumer")
    fig.ratio("ratio_cold_hot", "cold dishes / hot dish", "try_http_cold", "try_http_hot", "target >= 1")


def write(b, error):
    fig = b.fig
    if b.mode != "A/B":  # an A/B run has none of those figures, only its own ratio
        _baseline_ratios(fig)
    took = time.time() - b.t_start
    load = os.getloadavg()
    header = (f"stocksvr bench, {b.label} {b.stamp} UTC, git {b.git_rev}, binary {b.a.bin}\n"
              + (f"settings: {', '.join(b.a.set)}\n" if b.a.set else "")
              + (f"B: {b.a.against or b.a.bin}" + (f" with {', '.join(b.a.against_set)}" if b.a.against_set else "")
                 + "\n" if b.a.against or b.a.against_set else "")
              + f"{os.cpu_count()} cores, load average at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
              f"'others' below = CPU of processes the bench did not start (other builds and tests)")
    phase_lines = [b.phase_line(p) for p in b.phases if p["name"] not in ("warm-up",)]
    durability = b.durability or ["not run"]
    if error is not None:
        durability = [*durability, f"RUN FAILED: {type(error).__name__}: {error}".splitlines()[0]]
    notes = [f"note: {n}" for n in b.notes]
    text = report.table(fig, header, phase_lines + notes, durability,
                        f"took {int(took // 60)} min {int(took % 60)} s, {b.label}; results in {b.out}")
    print("\n" + text, flush=True)
    with open(os.path.join(b.out, "table.txt"), "w") as f:
        f.write(text + "\n")
    report.write_csv(os.path.join(b.out, "figures.csv"), fig)
    report.write_phases_csv(os.path.join(b.out, "phases.csv"), b.phases)
    dump_json(os.path.join(b.out, "raw.json"), {"raw": b.raw, "phases": b.phases, "notes": b.notes})
    sweep = b.raw.get("sweep")
    if sweep:
        report.plot(os.path.join(b.out, "sweep.png"), sweep,
                    {"bare hot-row UPDATE (64)": fig.get("bare_update"),
                     "the Try's SQL replayed (64)": fig.get("try_sql_64")},
                    f"stocksvr Try through HTTP, hot dish ({b.mode} run {b.stamp})")


if __name__ == "__main__":
    sys.exit(main())
