"""codes, avro and stack: what needs no server."""

import json
import os

import pytest

from stocksvr_harness import REPO, SCHEMAS, avro, codes, stack


def test_sql_lists_are_integers_only():
    assert codes.sql_list(codes.INTERMEDIATE) == "(10,30,50,80)"
    assert codes.sql_list([codes.RESERVED]) == "(20)"
    with pytest.raises(ValueError):
        codes.sql_list(["20) OR (1=1"])


def test_every_reservation_status_has_its_name():
    assert set(codes.INTERMEDIATE) | set(codes.HOLDING) <= set(codes.RESERVATION_STATUS)
    assert codes.RESERVATION_STATUS[codes.CREATED_RESERVED] == "CREATED_RESERVED"
    assert "o.status IN (20, 40)" in codes.OUTBOX_UNSENT_FROM


def test_the_subject_is_topic_record_name_strategy():
    with open(os.path.join(SCHEMAS, "OrderCreated.avsc"), encoding="utf-8") as f:
        schema = f.read()
    name = json.loads(schema)
    assert avro.subject("ns.order.lifecycle.v1", schema) == f"ns.order.lifecycle.v1-{name['namespace']}.{name['name']}"


def test_the_schema_id_is_read_from_the_wire_format_prefix():
    assert avro.schema_id(b"\x00\x00\x00\x01\x2a" + b"body") == 298
    assert avro.schema_id(b"\x00\x00") is None
    assert avro.schema_id(None) is None


def test_serializers_load_every_order_event_schema():
    s = avro.Serializers("http://127.0.0.1:9/apis/ccompat/v7")  # no request until a value is made
    assert sorted(s.by_event) == sorted(avro.ORDER_EVENTS)


def test_the_order_producer_is_idempotent_with_acks_all():
    p = avro.order_producer("127.0.0.1:9", "test-client", linger_ms=5)
    assert p is not None  # librdkafka accepted enable.idempotence, acks=all and linger.ms


def test_a_stack_knows_its_ports_and_environment(tmp_path):
    s = stack.Stack(str(tmp_path / "stack"), 25000, str(tmp_path / "logs"), cache="/c", STACK_SERVICES="redis")
    assert (s.port("mariadb"), s.port("redis"), s.port("registry"), s.port("kafka")) == (25007, 25080, 25081, 25092)
    assert s.env["STACK_PORT_BASE"] == "25000" and s.env["STACK_CACHE"] == "/c"
    assert s.env["STACK_SERVICES"] == "redis"
    assert s.repo == REPO


def test_a_harness_never_inherits_stocksvr_settings():
    env = {"PATH": "/bin", "STOCKSVR__MYSQL__URL": "mysql://shared", "STOCKSVR_CONFIG": "x.toml"}
    assert stack.without_stocksvr_settings(env) == {"PATH": "/bin"}


def test_event_times_are_utc_milliseconds_with_z():
    import datetime as dt

    t = dt.datetime(2026, 12, 7, 13, 0, 1, 234567, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert avro.rfc3339(t) == "2026-12-07T12:00:01.234Z"
    assert avro.rfc3339().endswith("Z")


@pytest.mark.parametrize("event", avro.ORDER_EVENTS)
def test_the_envelope_fits_each_order_event_schema(event):
    """What the harnesses produce must be what the schemas accept (checked without a registry)."""
    from fastavro import parse_schema
    from fastavro.validation import validate

    with open(os.path.join(SCHEMAS, f"{event}.avsc"), encoding="utf-8") as f:
        schema = parse_schema(json.load(f))
    with open(os.path.join(SCHEMAS, "examples", f"{event}.json"), encoding="utf-8") as f:
        example = json.load(f)
    record = avro.envelope(event, "e-1", 42, example["data"], "test-order-service")
    assert record["partition_key"] == "42" and record["trace_id"] is None
    assert validate(record, schema, raise_errors=True)
