"""scripts/stack (and scripts/toxiproxy) of one stack: a private one on a port base of its own
(a chaos run, the bench's MariaDB and Redis) or the shared one. Ports as scripts/stack
documents them: B+7 MariaDB, B+80 Redis, B+81 the registry, B+92 Kafka (+10 per further
broker).
"""

import os
import subprocess

from . import REPO, HarnessError
from .procs import run

PORT_OFFSETS = {"mariadb": 7, "redis": 80, "registry": 81, "kafka": 92}


class StackError(HarnessError):
    """A script of the stack failed (its log says why)."""


def without_stocksvr_settings(env):
    """A copy of `env` without STOCKSVR__ settings or STOCKSVR_CONFIG: a harness sets every
    value its stocksvr processes see, and never inherits a caller's (e.g. the shared stack's)."""
    return {k: v for k, v in env.items() if not k.startswith("STOCKSVR__") and k != "STOCKSVR_CONFIG"}


class Stack:
    """The scripts of one stack. Each script's output goes to `<logs>/<script>.log`."""

    def __init__(self, stack_dir, port_base, logs, cache=None, repo=REPO, **env):
        self.repo = repo
        self.stack_dir = stack_dir
        self.base = port_base
        self.logs = logs
        os.makedirs(logs, exist_ok=True)
        self.env = dict(os.environ, STACK_DIR=stack_dir, STACK_PORT_BASE=str(port_base), **env)
        if cache:
            self.env["STACK_CACHE"] = cache

    def port(self, server):
        return self.base + PORT_OFFSETS[server]

    def script(self, name, *args, timeout=600, check=True):
        """Runs scripts/<name> with the stack's environment; its exit status."""
        cmd = [os.path.join(self.repo, "scripts", name), *args]
        rc, _ = run(cmd, os.path.join(self.logs, f"{name}.log"), env=self.env, timeout=timeout, check=check,
                    error=StackError)
        return rc

    def up(self, *servers, timeout=600):
        return self.script("stack", "up", *servers, timeout=timeout)

    def down(self, *servers, timeout=300, check=False):
        return self.script("stack", "down", *servers, timeout=timeout, check=check)

    def toxiproxy(self, *args, timeout=900, check=True):
        return self.script("toxiproxy", *args, timeout=timeout, check=check)

    def pid(self, server):
        """The pid of one server of the stack, or None when it is not running."""
        p = subprocess.run([os.path.join(self.repo, "scripts", "stack"), "pid", server], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            return None
        try:
            return int(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
