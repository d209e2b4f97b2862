"""The processes a harness starts (stocksvr roles, load tools, commands): each with its output
appended to a log file, stopped by its own pid, never by name.

    role = Child([binary, "projector"], log, env=env, cwd=repo, new_session=True).start()
    role.stop(grace=25)            # SIGTERM, SIGKILL after the grace
    role.kill()                    # kill -9
    role.signal(signal.SIGSTOP)
    rc, out = run([binary, "migrate"], cli_log, env=env)
"""

import os
import signal
import subprocess
import time

from . import HarnessError

BANNER = "==== start"


class CommandFailed(HarnessError):
    """A command exited non-zero; the message names it and ends with its log's last lines."""


class Exited(HarnessError):
    """A process exited while the harness waited on it."""


def tail(path, n=30):
    """The last `n` lines of a log file (its last 8 kB), or "(no log)"."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8000))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def run(cmd, log, env=None, timeout=600, check=True, cwd=None, error=CommandFailed):
    """Runs `cmd` to its end with its output appended to `log` as it comes (after a `$ cmd`
    line, so a command that hangs past `timeout` leaves what it printed); returns (returncode,
    output). `check`: a non-zero exit raises `error` with the log's tail."""
    with open(log, "a+") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        start = f.tell()
        p = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL, stdout=f,
                           stderr=subprocess.STDOUT)
        f.seek(start)
        output = f.read()
    if check and p.returncode != 0:
        raise error(f"{' '.join(map(str, cmd[:3]))} ... exited {p.returncode}; log {log}:\n{tail(log)}")
    return p.returncode, output


def last_error(log):
    """The last error a process logged in its latest run (its log is appended per start, each
    start behind a BANNER line): the `stocksvr: ...` line main prints on a fatal error, an
    ERROR line or a panic; else the run's last line; None without a log."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = text.split(BANNER)[-1].splitlines()
    for line in reversed(lines):
        if line.startswith("stocksvr:") or "ERROR" in line or "panicked" in line:
            return line.strip()[:500]
    return lines[-1].strip()[:500] if lines else None


class Child:
    """One long-running process with its output appended to `log`. `new_session`: its own
    process group, so a Ctrl-C of the harness reaches the harness only (which then stops it)."""

    def __init__(self, argv, log, env=None, cwd=None, new_session=False):
        self.argv = [str(a) for a in argv]
        self.log = log
        self.env = env
        self.cwd = cwd
        self.new_session = new_session
        self.proc = None

    def start(self):
        with open(self.log, "a") as out:
            out.write(f"\n{BANNER} {time.strftime('%H:%M:%S')} {' '.join(self.argv[1:])} ====\n")
            out.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=self.new_session)
        return self

    @property
    def pid(self):
        return None if self.proc is None else self.proc.pid

    @property
    def returncode(self):
        return None if self.proc is None else self.proc.poll()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def last_error(self):
        return last_error(self.log)

    def check_running(self, when=""):
        """Raises Exited (with the exit status and the last error logged) when it exited."""
        if not self.alive():
            raise Exited(f"{' '.join(self.argv[:2])} exited with {self.returncode} {when}; "
                         f"log {self.log}: {self.last_error()}")

    def signal(self, sig):
        """Sends `sig` (SIGSTOP, SIGCONT, ...) if it is running; returns its pid or None."""
        if not self.alive():
            return None
        os.kill(self.proc.pid, sig)
        return self.proc.pid

    def kill(self, wait=30):
        """kill -9 and reap it; returns its pid, or None when it was not running."""
        if not self.alive():
            return None
        self.proc.kill()
        self.proc.wait(timeout=wait)
        return self.proc.pid

    def stop(self, grace=25.0):
        """SIGTERM (a stocksvr role drains and commits), SIGKILL after `grace` seconds.
        Returns (exit status, whether SIGTERM was enough); (None, True) if never started."""
        if self.proc is None:
            return None, True
        if self.proc.poll() is not None:
            return self.proc.returncode, True
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace), True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=30), False
