"""The order service's side of the contract, written once: records go through the stock
Confluent client's AvroSerializer (Confluent wire format: magic byte 0, a 4-byte schema id,
the Avro body), each schema auto-registered under TopicRecordNameStrategy
(`<topic>-<record full name>`), the key the plain UTF-8 partition key, and an idempotent
producer with acks=all. What a Python team would write; nothing here is stocksvr's own code.

    events = Serializers(registry_url)                  # schemas/<Event>.avsc of ORDER_EVENTS
    value = events.value("OrderCreated", payload, topic)
    producer = order_producer(bootstrap, "chaos-order-service", linger_ms=5)
"""

import datetime as dt
import json
import os
import struct

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from . import SCHEMAS

ORDER_EVENTS = ("OrderCreated", "OrderCreatedFailed", "OrderCanceled", "RefundRequested")


def rfc3339(t=None):
    """An event timestamp as the order service writes it: UTC, milliseconds, `Z`."""
    t = t or dt.datetime.now(dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def envelope(event_type, event_id, order_id, data, producer, occurred_at=None):
    """The envelope every order event carries (schemas/*.avsc): keyed and partitioned by the
    order id, no trace id, `occurred_at` now unless given."""
    return {
        "event_id": event_id,
        "event_type": event_type,
        "schema_version": 1,
        "occurred_at": occurred_at or rfc3339(),
        "producer": producer,
        "trace_id": None,
        "partition_key": str(order_id),
        "data": data,
    }


def serializer(registry, schema_str):
    """The stock AvroSerializer of one writer schema, registering it on first use."""
    return AvroSerializer(registry, schema_str, conf={
        "auto.register.schemas": True,
        "subject.name.strategy": topic_record_subject_name_strategy,
    })


def subject(topic, schema_str):
    """The subject TopicRecordNameStrategy registers a schema under for `topic`."""
    schema = json.loads(schema_str)
    return topic_record_subject_name_strategy(SerializationContext(topic, MessageField.VALUE),
                                              f"{schema['namespace']}.{schema['name']}")


def schema_id(value):
    """The schema id of a Confluent wire-format value (None when it is not one)."""
    if not value or len(value) < 5:
        return None
    return struct.unpack(">bI", value[:5])[1]


class Serializers:
    """One AvroSerializer per event (`schemas/<Event>.avsc`), sharing one registry client."""

    def __init__(self, registry_url, events=ORDER_EVENTS, schemas_dir=SCHEMAS, registry_conf=None):
        # registry_conf: more client settings (a secure registry's CA and credentials).
        self.registry = SchemaRegistryClient({"url": registry_url, **(registry_conf or {})})
        self.by_event = {}
        for name in events:
            with open(os.path.join(schemas_dir, f"{name}.avsc"), encoding="utf-8") as f:
                self.by_event[name] = serializer(self.registry, f.read())

    def value(self, event, payload, topic):
        """The record value of `payload` (plain JSON: nullable fields as value or null)."""
        return self.by_event[event](payload, SerializationContext(topic, MessageField.VALUE))


def order_producer(bootstrap, client_id=None, security=None, **conf):
    """The order service's producer: idempotent, acks=all; `security` adds librdkafka settings
    as they are spelled (a secure cluster's), `conf` adds or overrides settings with
    underscores for dots (linger_ms=5, message_timeout_ms=600000)."""
    settings = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", **(security or {})}
    if client_id:
        settings["client.id"] = client_id
    settings.update({k.replace("_", "."): v for k, v in conf.items()})
    return Producer(settings)
