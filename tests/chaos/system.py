"""The system under test: a private stack (scripts/stack with its own STACK_DIR and port base),
toxiproxy in front of MySQL, Redis and Kafka (scripts/toxiproxy), and the stocksvr roles as
separate processes pointed at the proxies.

Ports (B = --port-base): the servers as scripts/stack documents (mariadb B+7, redis B+80,
registry B+81, kafka B+92), the proxies at server + 100 (B+107, B+180, B+192), the toxiproxy
API at B+174, and the roles' HTTP listeners at B+41..B+46 (see ROLES).

`secure=True` (scripts/chaos --secure): the stack is `scripts/stack up --secure` and every
connection is secured as there (TLS through the proxies, which forward bytes): the roles and
commands are the `stocksvr` principal with only the ACLs `stocksvr acls print` prints, the
harness's own clients the stack's admin users (stocksvr_harness.secure).
"""

import os
import signal
import subprocess
import time

from stocksvr_harness import http, procs
from stocksvr_harness.secure import PlainClients, SecureClients, stack_exports
from stocksvr_harness.stack import Stack, without_stocksvr_settings
from stocksvr_harness.wait import WaitTimeout

# role name -> (stocksvr subcommand, HTTP port offset). `order-lifecycle` and `all` serve the API.
ROLES = {
    "order-lifecycle": ("order-lifecycle", 41),
    "outbox-relay": ("outbox-relay", 42),
    "projector": ("projector", 43),
    "dead-letter": ("dead-letter", 44),
    "schedule": ("schedule", 45),
    "all": ("all", 46),
}
# Lists (changed in place by cluster.configure for `--instances N` / `--kafka-brokers N`).
API_ROLES = ["order-lifecycle", "all"]
SERVERS = ["mariadb", "redis", "kafka", "registry"]
# Settings the harness gives that this release added since the previous one (upgrade runs):
# a role of the previous release runs without them, as an operator rolls out a new setting
# only once every instance runs the release that knows it (the previous one refuses unknown
# keys at start; docs/operations.md, "Upgrading"). Setup checks the rest with
# `stocksvr config` of the previous binary, so a new setting missing here fails loudly.
NEW_SINCE_PREVIOUS = ("STOCKSVR__HTTP__DRAIN_GRACE_MS",)


class System:
    def __init__(self, repo, run_dir, base, cache, binary, history, settings, kafka_brokers=1, secure=False,
                 previous_binary=None):
        self.repo = repo
        self.run_dir = run_dir
        self.base = base
        self.binary = binary
        # Upgrade runs: the previous release's binary, and the roles that still run it.
        self.previous_binary = previous_binary
        self.on_previous = set()
        self.history = history
        self.settings = settings  # extra STOCKSVR__ variables for the roles
        self.stack_dir = os.path.join(run_dir, "stack")
        self.logs = os.path.join(run_dir, "logs")
        # A Kafka cluster (issue 14): no proxy in front of it (toxiproxy forwards one broker
        # only), every client bootstraps from the brokers' own ports; topics get 3 replicas.
        self.kafka_brokers = kafka_brokers
        cluster = {"STACK_KAFKA_PROXIED": "0", "STACK_KAFKA_BROKERS": str(kafka_brokers)} if kafka_brokers > 1 else {}
        self.secure = secure
        self.stack = Stack(self.stack_dir, base, self.logs, cache=cache, repo=repo,
                           **{"STACK_KAFKA_PROXIED": "1", "STACK_SECURE": "1" if secure else "0", **cluster})
        # Settings of the Python clients (and of the commands' other principals): known once
        # the secure stack made its certificates and secrets (stack_up).
        self.clients = PlainClients()
        # Never inherit a caller's STOCKSVR__ settings (e.g. the shared stack's): every
        # value the roles and commands see is set below.
        self.env = without_stocksvr_settings(self.stack.env)
        self.port = {server: self.stack.port(server) for server in ("mariadb", "redis", "registry", "kafka")}
        self.proxy_port = {"mysql": base + 107, "redis": base + 180, "kafka": base + 192}
        self.toxiproxy_api = f"http://127.0.0.1:{base + 174}"
        scheme = "https" if secure else "http"
        self.registry_url = f"{scheme}://127.0.0.1:{self.port['registry']}/apis/ccompat/v7"
        # A secure broker's certificate names localhost (and 127.0.0.1); it advertises localhost.
        host = "localhost" if secure else "127.0.0.1"
        self.kafka_host = host
        self.kafka_direct = ",".join(f"{host}:{self.port['kafka'] + 10 * i}" for i in range(kafka_brokers))
        self.procs = {}  # role -> procs.Child
        self.started_at = {}

    # ---- scripts -------------------------------------------------------------------------

    def stack_up(self, *servers, timeout=600):
        rc = self.stack.up(*(servers or SERVERS), timeout=timeout)
        if self.secure and isinstance(self.clients, PlainClients):
            self.clients = SecureClients(stack_exports(self.stack.env, self.repo))
        return rc

    def stack_down(self):
        return self.stack.down()

    def server_pid(self, server):
        return self.stack.pid(server)

    def toxiproxy(self, *args, timeout=900, check=True):
        return self.stack.toxiproxy(*args, timeout=timeout, check=check)

    # ---- toxiproxy API -------------------------------------------------------------------

    def toxi(self, method, path, body=None, timeout=5):
        return http.call_json(method, self.toxiproxy_api + path, body, timeout=timeout)

    def add_toxic(self, proxy, name, toxic_type, attributes, stream="downstream"):
        return self.toxi("POST", f"/proxies/{proxy}/toxics",
                         {"name": name, "type": toxic_type, "stream": stream, "toxicity": 1.0,
                          "attributes": attributes})

    def remove_toxic(self, proxy, name):
        return self.toxi("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def toxi_reset(self):
        return self.toxi("POST", "/reset")

    # ---- stocksvr commands ---------------------------------------------------------------

    def direct_env(self, previous=False):
        """stocksvr settings straight to the servers (setup, operator commands, checker);
        `previous`: for the previous release's binary (without NEW_SINCE_PREVIOUS)."""
        env = dict(self.env)
        # Secure: the stack's own settings of the service principal (TLS, SASL, secret files).
        env.update(self.clients.service_env())
        env.update({
            "STOCKSVR__KAFKA__BROKERS": self.kafka_direct,
            "STOCKSVR__REGISTRY__URL": self.registry_url,
            "STOCKSVR__HTTP__LISTEN": f"127.0.0.1:{self.base + 88}",
            "STOCKSVR__KAFKA__TOPICS_FILE": os.path.join(self.repo, "topics.yaml"),
            "RUST_LOG": "warn",
        })
        if not self.secure:
            env["STOCKSVR__MYSQL__URL"] = f"mysql://stocksvr:stocksvr@127.0.0.1:{self.port['mariadb']}/stocksvr"
            env["STOCKSVR__REDIS__URL"] = f"redis://127.0.0.1:{self.port['redis']}/"
        if self.kafka_brokers > 1:
            env["STOCKSVR__KAFKA__TOPICS_ENVIRONMENT"] = "cluster"
        env.update(self.settings)
        if previous:
            for key in NEW_SINCE_PREVIOUS:
                env.pop(key, None)
        return env

    def role_env(self, role):
        """A role's settings: MySQL, Redis and Kafka through toxiproxy, the registry direct."""
        env = self.direct_env(previous=role in self.on_previous)
        # The same URLs (user, TLS parameters) with the proxies' ports.
        proxied = (("STOCKSVR__MYSQL__URL", "mariadb", "mysql"), ("STOCKSVR__REDIS__URL", "redis", "redis"))
        for key, server, proxy in proxied:
            env[key] = env[key].replace(f"127.0.0.1:{self.port[server]}/", f"127.0.0.1:{self.proxy_port[proxy]}/", 1)
        env.update({
            "STOCKSVR__KAFKA__BROKERS": f"{self.kafka_host}:{self.proxy_port['kafka']}",
            "STOCKSVR__HTTP__LISTEN": f"127.0.0.1:{self.role_port(role)}",
            "STOCKSVR__KAFKA__CLIENT_ID": f"chaos-{role}",
        })
        if self.kafka_brokers > 1:
            env["STOCKSVR__KAFKA__BROKERS"] = self.kafka_direct
        env.pop("RUST_LOG", None)
        return env

    def cli(self, *args, timeout=120, env=None, previous=False):
        """Run a stocksvr command straight against the servers, `env` on top of its settings
        (another principal); `previous`: the previous release's binary. (returncode, stdout,
        stderr)"""
        binary = self.previous_binary if previous else self.binary
        p = subprocess.run([binary, *args], env={**self.direct_env(previous), **(env or {})}, cwd=self.repo,
                           capture_output=True, text=True, timeout=timeout)
        with open(os.path.join(self.logs, "cli.log"), "a") as log:
            which = " (previous release)" if previous else ""
            log.write(f"\n$ stocksvr{which} {' '.join(args)}\n-> {p.returncode}\n{p.stdout}{p.stderr}")
        return p.returncode, p.stdout, p.stderr

    # ---- roles ---------------------------------------------------------------------------

    def role_port(self, role):
        return self.base + ROLES[role][1]

    def api_url(self, role):
        return f"http://127.0.0.1:{self.role_port(role)}"

    def role_log(self, role):
        return os.path.join(self.logs, f"role-{role}.log")

    def start_role(self, role):
        """Start a role (again) with the binary it runs: the previous release's while it is in
        `on_previous`, else this one."""
        self.reap(role)
        previous = role in self.on_previous
        binary = self.previous_binary if previous else self.binary
        child = procs.Child([binary, ROLES[role][0]], self.role_log(role), env=self.role_env(role),
                            cwd=self.repo, new_session=True).start()
        self.procs[role] = child
        self.started_at[role] = time.monotonic()
        self.history.record("role", role=role, action="start", pid=child.pid,
                            release="previous" if previous else "current")
        return child.pid

    def role_alive(self, role):
        p = self.procs.get(role)
        return p is not None and p.alive()

    def reap(self, role):
        p = self.procs.get(role)
        if p is not None and not p.alive():
            self.history.record("role", role=role, action="exited", pid=p.pid, returncode=p.returncode)
            del self.procs[role]

    def exit_reason(self, role):
        """The last error a role logged in its latest run (its log is appended per start)."""
        return procs.last_error(self.role_log(role))

    def kill_role(self, role, sig=signal.SIGKILL):
        p = self.procs.get(role)
        if p is None or not p.alive():
            return None
        if sig != signal.SIGKILL:
            return p.signal(sig)
        pid = p.kill()
        self.history.record("role", role=role, action="killed", pid=pid, signal="SIGKILL")
        del self.procs[role]
        return pid

    def stop_role(self, role, grace=25.0):
        """SIGTERM, wait for the drain (README: within 15 s), SIGKILL after `grace` seconds."""
        p = self.procs.get(role)
        if p is None:
            return None
        code, drained = p.stop(grace)
        if not drained:
            self.history.record("role", role=role, action="sigterm-ignored", pid=p.pid, grace=grace)
        self.history.record("role", role=role, action="stopped", pid=p.pid, returncode=code)
        del self.procs[role]
        return code

    def wait_healthy(self, role, deadline_s=60.0):
        """Whether the role answers /healthz within `deadline_s` (False at once if it exits)."""
        return self._wait_answer(role, "/healthz", deadline_s)

    def wait_ready(self, role, deadline_s=90.0):
        """Whether the role answers /readyz with 200 (every dependency reachable) within
        `deadline_s` (False at once if it exits): what a load balancer or a roll waits for."""
        return self._wait_answer(role, "/readyz", deadline_s)

    def _wait_answer(self, role, path, deadline_s):
        child = self.procs.get(role)
        if child is None:
            return False
        try:
            http.wait_http(self.api_url(role) + path, deadline_s, f"role {role} {path}", child=child)
            return True
        except (WaitTimeout, procs.Exited):
            return False

    def stop_all_roles(self):
        for role in list(self.procs):
            self.stop_role(role)

    def kill_everything(self):
        """Last-resort cleanup: the roles we started, then the private servers and toxiproxy."""
        for p in self.procs.values():
            try:
                p.kill(wait=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        # A SIGSTOPped server would ignore the SIGTERM of `stack down`.
        self.continue_servers()
        self.toxiproxy("down", check=False, timeout=60)
        self.stack_down()

    def continue_servers(self):
        """SIGCONT to every server of the stack (a stop fault may have left one stopped)."""
        for server in SERVERS:
            pid = self.server_pid(server)
            if pid:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
