"""secure: a secure stack's exports turned into the Python clients' settings (no server)."""

import os
import subprocess

import pytest

from stocksvr_harness import secure


@pytest.fixture
def exports(tmp_path):
    tls, secrets = tmp_path / "tls", tmp_path / "secrets"
    tls.mkdir()
    secrets.mkdir()
    for name, value in (("kafka-admin", "k-admin"), ("kafka-order-service", "k-order"),
                        ("registry-admin", "r-admin"), ("mariadb-stocksvr_admin", "m-admin"),
                        ("redis-admin", "x-admin")):
        (secrets / f"{name}.password").write_text(value + "\n")
    return {
        "STACK_TLS_DIR": str(tls),
        "STACK_KAFKA_ADMIN_PROPERTIES": str(secrets / "kafka-admin.properties"),
        "STACK_MYSQL_ADMIN_URL": "mysql://stocksvr_admin@127.0.0.1:1/stocksvr?ssl-mode=VERIFY_IDENTITY",
        "STACK_MYSQL_ADMIN_PASSWORD_FILE": str(secrets / "mariadb-stocksvr_admin.password"),
        "STACK_REDIS_ADMIN_PASSWORD_FILE": str(secrets / "redis-admin.password"),
        "STACK_KAFKA_TOPICS_ADMIN_USER": "stocksvr-admin",
        "STACK_KAFKA_TOPICS_ADMIN_PASSWORD_FILE": "/s/p",
        "STACK_KAFKA_TOPICS_ADMIN_CERT_FILE": "/s/c",
        "STACK_KAFKA_TOPICS_ADMIN_KEY_FILE": "/s/k",
        "STOCKSVR__KAFKA__SASL__USERNAME": "stocksvr",
    }


def test_each_client_gets_its_principal_and_the_ca(exports):
    c = secure.SecureClients(exports)
    ca = os.path.join(exports["STACK_TLS_DIR"], "ca.crt")
    kafka = c.kafka("order-service")
    assert kafka["security.protocol"] == "SASL_SSL" and kafka["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert (kafka["sasl.username"], kafka["sasl.password"]) == ("order-service", "k-order")
    assert kafka["ssl.ca.location"] == ca
    assert kafka["ssl.certificate.location"].endswith("client-order-service.crt")
    assert c.kafka()["sasl.password"] == "k-admin"
    assert c.registry() == {"ssl.ca.location": ca, "basic.auth.user.info": "admin:r-admin"}
    assert c.mysql() == {"user": "stocksvr_admin", "password": "m-admin", "ssl": {"ca": ca, "check_hostname": True}}
    assert c.redis() == {"username": "admin", "password": "x-admin", "ssl": True, "ssl_ca_certs": ca}


def test_commands_get_the_other_principals_as_stocksvr_settings(exports):
    c = secure.SecureClients(exports)
    assert c.service_env() == {"STOCKSVR__KAFKA__SASL__USERNAME": "stocksvr"}
    assert c.mysql_admin_env()["STOCKSVR__MYSQL__URL"].startswith("mysql://stocksvr_admin@")
    assert c.kafka_principal_env("TOPICS_ADMIN") == {
        "STOCKSVR__KAFKA__SASL__USERNAME": "stocksvr-admin", "STOCKSVR__KAFKA__SASL__PASSWORD_FILE": "/s/p",
        "STOCKSVR__KAFKA__TLS__CERT_FILE": "/s/c", "STOCKSVR__KAFKA__TLS__KEY_FILE": "/s/k"}


def test_a_plaintext_stack_adds_nothing_but_the_dev_user():
    c = secure.PlainClients()
    assert c.kafka() == c.registry() == c.redis() == c.service_env() == c.mysql_admin_env() == {}
    assert c.kafka_principal_env("TOPICS_ADMIN") == {}
    assert c.mysql() == {"user": "stocksvr", "password": "stocksvr"}


def test_exports_are_read_from_scripts_stack_env(tmp_path):
    script = tmp_path / "scripts" / "stack"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho '# a comment'\necho \"export A=1\"\necho \"export B='x?y=z'\"\n")
    script.chmod(0o755)
    assert secure.stack_exports(dict(os.environ), repo=str(tmp_path)) == {"A": "1", "B": "x?y=z"}
    script.write_text("#!/bin/sh\nexit 3\n")
    with pytest.raises(subprocess.CalledProcessError):
        secure.stack_exports(dict(os.environ), repo=str(tmp_path))
