#!/usr/bin/env python3
"""Runs the test binaries cargo built, several at a time, and says where the time went.

`cargo test` runs its test binaries one after another; most of ours spend their time waiting
on real servers (a consumer group to settle, a stopped MariaDB, a child process), so running a
few at once cuts the suite's wall time without starving any one of them. The binaries come
from `cargo test --no-run --message-format=json` (one build for everything: the suite, the
Redis Cluster set and the chaos runs' binary), so nothing here compiles.

    cargo test --workspace --no-run --message-format=json > build.json
    testrun.py build.json --jobs 3 [--only PKG:NAME ...] [--log-dir DIR] [-- ARGS]

Each binary runs in its package's folder, as cargo would run it, with ARGS (e.g.
`--test-threads 4`). The longest binaries of the previous run (kept in --times) start first,
so a long one does not begin last. Prints one line per binary as it ends, then a table of
every binary by duration and the totals; the output of a failed binary is printed whole.
Exit 0 when every binary passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")


@dataclass
class Binary:
    """One test executable cargo built."""

    package: str
    name: str
    kind: str
    executable: str
    cwd: str

    @property
    def key(self) -> str:
        return f"{self.package}:{self.name}"


@dataclass
class Outcome:
    binary: Binary
    seconds: float
    code: int
    passed: int = 0
    failed: int = 0
    ignored: int = 0
    output: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.code == 0


def package_name(package_id: str, folder: str) -> str:
    """The package's name from cargo's package id: `path+file:///…/store#stocksvr-store@0.1.0`
    (cargo 1.77+) or `stocksvr-store 0.1.0 (path+file:///…)`; the folder's name otherwise."""
    if "#" in package_id:
        spec = package_id.rsplit("#", 1)[1]
        name = spec.split("@", 1)[0]
        # `…/store#0.1.0` when the name equals the folder's
        return folder if name[:1].isdigit() else name
    if " " in package_id:
        return package_id.split(" ", 1)[0]
    return folder


def binaries(messages: list[str]) -> list[Binary]:
    """The test executables among cargo's JSON messages (one object per line)."""
    found: dict[str, Binary] = {}
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = Path(msg["manifest_path"]).parent
        kind = target["kind"][0]
        name = "unittests" if kind in ("lib", "bin") else target["name"]
        if kind == "bin":
            name = f"unittests-bin-{target['name']}"
        b = Binary(package_name(msg.get("package_id", ""), package.name), name, kind, msg["executable"], str(package))
        found[b.executable] = b
    return sorted(found.values(), key=lambda b: b.key)


def parse_results(output: str) -> tuple[int, int, int]:
    """(passed, failed, ignored) summed over the `test result:` lines of a binary's output."""
    passed = failed = ignored = 0
    for line in output.splitlines():
        m = RESULT.match(line.strip())
        if m:
            passed += int(m.group(2))
            failed += int(m.group(3))
            ignored += int(m.group(4))
    return passed, failed, ignored


FRAME = re.compile(r"^\s+(\d+: |at )")
PANIC = re.compile(r"^thread '([^']+)' .*panicked at (.*?):?$")


def without_backtraces(output: str) -> str:
    """A binary's output with the frames of its backtraces left out: they fill the part of a
    CI log that is kept and hide the next failure's message (the log file keeps them)."""
    return "\n".join(line for line in output.splitlines() if not FRAME.match(line))


def failure_digest(output: str, limit: int = 400) -> list[str]:
    """One line per panic in `output`: the test, where it panicked and the start of its
    message, so every failure of a run shows even when only the start of the log is read."""
    lines = output.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = PANIC.match(line)
        if not m:
            continue
        message = []
        for follow in lines[i + 1 :]:
            ends = ("stack backtrace:", "note: ", "---- ", "thread '", "failures:", "test result:")
            if follow.startswith(ends) or FRAME.match(follow) or (message and not follow.strip()):
                break
            message.append(follow.strip())
        text = " ".join(part for part in message if part)
        if len(text) > limit:
            text = text[:limit] + " …"
        found.append(f"{m.group(1)} at {m.group(2)}: {text}")
    return found


def order(bins: list[Binary], times: dict[str, float]) -> list[Binary]:
    """Longest first by the previous run's times; binaries never timed go first of all (they
    may be long), then by name for a stable order."""
    return sorted(bins, key=lambda b: (-(times.get(b.key, float("inf"))), b.key))


def select(bins: list[Binary], only: list[str]) -> list[Binary]:
    """The binaries named `PKG:NAME` (or `PKG:*` for all of a package); all when none named."""
    if not only:
        return bins
    chosen = []
    for b in bins:
        for want in only:
            pkg, _, name = want.partition(":")
            if b.package == pkg and name in ("*", b.name):
                chosen.append(b)
                break
    missing = [w for w in only if not any(b.package == w.partition(":")[0] for b in chosen)]
    if missing:
        raise SystemExit(f"testrun: no test binary for {', '.join(missing)}")
    return chosen


def run_one(b: Binary, args: list[str], log_dir: Path | None) -> Outcome:
    env = dict(os.environ, CARGO_MANIFEST_DIR=b.cwd, CARGO_PKG_NAME=b.package)
    start = time.monotonic()
    proc = subprocess.run(
        [b.executable, *args], cwd=b.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False
    )
    out = proc.stdout.decode("utf-8", "replace")
    seconds = time.monotonic() - start
    if log_dir:
        (log_dir / f"{b.package}.{b.name}.log").write_text(out)
    passed, failed, ignored = parse_results(out)
    return Outcome(b, seconds, proc.returncode, passed, failed, ignored, out)


def run_all(bins: list[Binary], jobs: int, args: list[str], log_dir: Path | None) -> list[Outcome]:
    queue = list(bins)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            o = run_one(b, args, log_dir)
            with lock:
                outcomes.append(o)
                state = "ok" if o.ok else f"FAILED (exit {o.code})"
                print(f"testrun: {b.key} {state}: {o.passed} passed, {o.failed} failed, {o.seconds:.1f} s", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    rows = sorted(outcomes, key=lambda o: -o.seconds)
    width = max((len(o.binary.key) for o in rows), default=10)
    lines = [f"{'test binary':<{width}}  {'seconds':>8}  {'passed':>6}  {'failed':>6}  result"]
    for o in rows:
        lines.append(
            f"{o.binary.key:<{width}}  {o.seconds:8.1f}  {o.passed:6}  {o.failed:6}  {'ok' if o.ok else 'FAILED'}"
        )
    return "\n".join(lines)


def load_times(path: Path | None) -> dict[str, float]:
    if not path or not path.exists():
        return {}
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except (ValueError, AttributeError):
        return {}


def save_times(path: Path | None, outcomes: list[Outcome], before: dict[str, float]) -> None:
    if not path:
        return
    times = dict(before)
    times.update({o.binary.key: round(o.seconds, 1) for o in outcomes})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(times, indent=1, sort_keys=True))


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="cargo test --no-run --message-format=json output")
    ap.add_argument("--jobs", type=int, default=3, help="binaries at once (default 3)")
    ap.add_argument("--only", action="append", default=[], help="PKG:NAME or PKG:* (repeatable)")
    ap.add_argument("--log-dir", type=Path, help="write each binary's output here")
    ap.add_argument("--times", type=Path, help="durations of the previous run (read, then rewritten)")
    a = ap.parse_args(argv)

    bins = select(binaries(a.build.read_text().splitlines()), a.only)
    if not bins:
        print("testrun: no test binaries in the build output", file=sys.stderr)
        return 1
    if a.log_dir:
        a.log_dir.mkdir(parents=True, exist_ok=True)
    before = load_times(a.times)
    start = time.monotonic()
    outcomes = run_all(order(bins, before), a.jobs, extra, a.log_dir)
    wall = time.monotonic() - start
    save_times(a.times, outcomes, before)

    failed_bins = [o for o in sorted(outcomes, key=lambda o: o.binary.key) if not o.ok]
    if failed_bins:
        print("\n==== failures, one line each (whole output below, and in --log-dir) ====")
        for o in failed_bins:
            for line in failure_digest(o.output) or [f"exit {o.code} without a panic message"]:
                print(f"{o.binary.key}: {line}")
    for o in failed_bins:
        print(f"\n==== output of {o.binary.key} (FAILED, exit {o.code}), backtraces left out ====\n"
              f"{without_backtraces(o.output)}")
    print()
    print(table(outcomes))
    passed = sum(o.passed for o in outcomes)
    failed = sum(o.failed for o in outcomes)
    broken = sum(1 for o in outcomes if not o.ok)
    busy = sum(o.seconds for o in outcomes)
    print(
        f"\ntestrun: {len(outcomes)} binaries, {passed} passed, {failed} failed, {broken} binaries failed; "
        f"{wall:.0f} s wall for {busy:.0f} s of tests ({a.jobs} at once)"
    )
    return 0 if broken == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
