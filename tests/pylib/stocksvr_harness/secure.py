"""The Python clients' settings for a secure stack (`scripts/stack up --secure`): what
`scripts/stack env` exports, turned into confluent-kafka, schema-registry, pymysql and
redis-py settings of one of the stack's principals. Secrets are read from the stack's files
when a client is made and never logged.

The harnesses' own checkers read everything (every table, every key, every group's offsets),
so they connect as the stack's admin users; `kafka(principal)` takes another Kafka principal
(the order service's producer writes as `order-service`, with only its printed ACL).
"""

import os
import subprocess

from . import REPO


def stack_exports(env, repo=REPO):
    """`scripts/stack env` of the stack `env` names (STACK_DIR, STACK_PORT_BASE, ...), as a dict."""
    p = subprocess.run([os.path.join(repo, "scripts", "stack"), "env"], env=env, capture_output=True,
                       text=True, timeout=60, check=True)
    found = {}
    for line in p.stdout.splitlines():
        if not line.startswith("export ") or "=" not in line:
            continue
        key, value = line[len("export "):].split("=", 1)
        found[key] = value.strip("'")
    return found


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class SecureClients:
    """Client settings of one secure stack, from its exports (see `stack_exports`)."""

    def __init__(self, exports):
        self.exports = exports
        self.tls = exports["STACK_TLS_DIR"]
        self.secrets = os.path.dirname(exports["STACK_KAFKA_ADMIN_PROPERTIES"])
        self.ca = os.path.join(self.tls, "ca.crt")

    def service_env(self):
        """The service's own STOCKSVR__ settings (its principal everywhere)."""
        return {k: v for k, v in self.exports.items() if k.startswith("STOCKSVR__")}

    def mysql_admin_env(self):
        """STOCKSVR__ settings that make a stocksvr command use the MariaDB admin (migrations)."""
        return {"STOCKSVR__MYSQL__URL": self.exports["STACK_MYSQL_ADMIN_URL"],
                "STOCKSVR__MYSQL__PASSWORD_FILE": self.exports["STACK_MYSQL_ADMIN_PASSWORD_FILE"]}

    def kafka_principal_env(self, role):
        """STOCKSVR__ settings of another Kafka principal; `role` as in STACK_KAFKA_<ROLE>_USER."""
        var = lambda suffix: self.exports[f"STACK_KAFKA_{role}_{suffix}"]  # noqa: E731
        return {"STOCKSVR__KAFKA__SASL__USERNAME": var("USER"),
                "STOCKSVR__KAFKA__SASL__PASSWORD_FILE": var("PASSWORD_FILE"),
                "STOCKSVR__KAFKA__TLS__CERT_FILE": var("CERT_FILE"),
                "STOCKSVR__KAFKA__TLS__KEY_FILE": var("KEY_FILE")}

    def kafka(self, principal="admin"):
        """confluent-kafka settings of a principal: SASL_SSL, SCRAM-SHA-512, its client certificate."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": principal,
                "sasl.password": _read(os.path.join(self.secrets, f"kafka-{principal}.password")),
                "ssl.ca.location": self.ca,
                "ssl.certificate.location": os.path.join(self.tls, f"client-{principal}.crt"),
                "ssl.key.location": os.path.join(self.tls, f"client-{principal}.key")}

    def registry(self, user="admin"):
        """SchemaRegistryClient settings (without "url"): the CA and basic auth."""
        return {"ssl.ca.location": self.ca,
                "basic.auth.user.info": f"{user}:{_read(os.path.join(self.secrets, f'registry-{user}.password'))}"}

    def mysql(self):
        """pymysql.connect arguments of the MariaDB admin (no host, port or database)."""
        return {"user": "stocksvr_admin", "password": _read(self.exports["STACK_MYSQL_ADMIN_PASSWORD_FILE"]),
                "ssl": {"ca": self.ca, "check_hostname": True}}

    def redis(self):
        """redis.Redis arguments of the Redis admin over TLS (no host or port)."""
        return {"username": "admin", "password": _read(self.exports["STACK_REDIS_ADMIN_PASSWORD_FILE"]),
                "ssl": True, "ssl_ca_certs": self.ca}


class PlainClients:
    """The same questions for a plaintext stack: no settings to add; the dev users."""

    def service_env(self):
        return {}

    def mysql_admin_env(self):
        return {}

    def kafka_principal_env(self, role):
        return {}

    def kafka(self, principal="admin"):
        return {}

    def registry(self, user="admin"):
        return {}

    def mysql(self):
        return {"user": "stocksvr", "password": "stocksvr"}

    def redis(self):
        return {}
