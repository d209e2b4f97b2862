"""procs: children with their log, stopped by their own pid; one-shot commands."""

import signal
import sys
import time

import pytest

from stocksvr_harness import procs
from stocksvr_harness.wait import wait_until

# A child that logs, ignores nothing, and exits 3 on SIGTERM after saying so.
POLITE = """
import signal, sys, time
def bye(*_):
    print("stocksvr: shutting down", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, bye)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def logged(log, text):
    return lambda: text in log.read_text()


def test_a_child_logs_behind_a_banner_and_stops_on_sigterm(tmp_path):
    log = tmp_path / "role.log"
    c = procs.Child([sys.executable, "-c", POLITE], str(log)).start()
    wait_until(logged(log, "\nready\n"), 10, "the child to start")
    assert c.alive()
    assert c.stop(grace=10) == (3, True)
    assert not c.alive()
    text = log.read_text()
    assert text.startswith(f"\n{procs.BANNER} ")
    assert c.last_error() == "stocksvr: shutting down"


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    log = tmp_path / "role.log"
    c = procs.Child([sys.executable, "-c", STUBBORN], str(log)).start()
    wait_until(logged(log, "\nready\n"), 10, "the child to start")
    code, drained = c.stop(grace=0.3)
    assert (code, drained) == (-signal.SIGKILL, False)


def test_kill_and_signals_act_on_the_child_only(tmp_path):
    log = tmp_path / "role.log"
    c = procs.Child([sys.executable, "-c", POLITE], str(log), new_session=True).start()
    wait_until(logged(log, "\nready\n"), 10, "the child to start")
    assert c.signal(signal.SIGSTOP) == c.pid
    assert c.signal(signal.SIGCONT) == c.pid
    assert c.kill() == c.pid
    assert c.returncode == -signal.SIGKILL
    assert c.kill() is None
    assert c.signal(signal.SIGCONT) is None
    with pytest.raises(procs.Exited, match="exited with -9"):
        c.check_running()


def test_last_error_reads_the_latest_run_only(tmp_path):
    log = tmp_path / "role.log"
    log.write_text(f"{procs.BANNER} 1\n2026 ERROR old failure\n{procs.BANNER} 2\nfine\nall good\n")
    assert procs.last_error(str(log)) == "all good"
    with log.open("a") as f:
        f.write("thread 'main' panicked at src/main.rs\nafter\n")
    assert procs.last_error(str(log)) == "thread 'main' panicked at src/main.rs"
    assert procs.last_error(str(tmp_path / "none.log")) is None


def test_run_appends_the_output_and_raises_with_its_tail(tmp_path):
    log = tmp_path / "cli.log"
    rc, out = procs.run([sys.executable, "-c", "print('one'); print('two')"], str(log))
    assert (rc, out) == (0, "one\ntwo\n")
    with pytest.raises(procs.CommandFailed) as e:
        procs.run([sys.executable, "-c", "import sys; print('why'); sys.exit(4)"], str(log))
    assert "exited 4" in str(e.value) and str(e.value).endswith("why")
    rc, _ = procs.run([sys.executable, "-c", "import sys; sys.exit(4)"], str(log), check=False)
    assert rc == 4
    assert log.read_text().count("\n$ ") == 3


def test_run_keeps_what_a_hanging_command_printed(tmp_path):
    log = tmp_path / "cli.log"
    with pytest.raises(Exception, match="timed out"):
        procs.run([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(30)"], str(log),
                  timeout=1)
    assert "started" in log.read_text()


def test_tail_gives_the_last_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {k}\n" for k in range(100)))
    assert procs.tail(str(log), 2) == "line 98\nline 99"
    assert procs.tail(str(tmp_path / "none")) == "(no log)"


def test_a_child_not_started_is_not_alive(tmp_path):
    c = procs.Child(["true"], str(tmp_path / "x.log"))
    assert not c.alive() and c.pid is None and c.returncode is None
    assert c.stop() == (None, True)
    time.sleep(0)  # nothing to wait for
