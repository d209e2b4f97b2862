#!/usr/bin/env python3
"""Produce one Avro record the way a Python team using the stock Confluent client would.

This is the interop proof for the order-service side of the contract: nothing here is
stocksvr-specific except the arguments. The value goes through confluent-kafka's
AvroSerializer (Confluent wire format: magic byte 0, 4-byte schema id, Avro body), the schema
is auto-registered under TopicRecordNameStrategy (`<topic>-<record full name>`), the key is
the plain UTF-8 string of the partition key.

Prints one JSON line: {"topic", "partition", "offset", "subject", "schema_id"}.
Exits 1 with a message on stderr if the record was not acknowledged.

Example:
  produce.py --bootstrap 127.0.0.1:9092 --registry http://127.0.0.1:8081/apis/ccompat/v7 \
      --topic order.lifecycle.v1 --schema-file schemas/OrderCreated.avsc \
      --payload-file schemas/examples/OrderCreated.json
"""

import argparse
import faulthandler
import json
import os
import sys

from confluent_kafka import KafkaException
from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from stocksvr_harness import avro


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7",
                    help="schema.registry.url (Apicurio: .../apis/ccompat/v7)")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--schema-file", required=True, help="writer schema (.avsc)")
    ap.add_argument("--payload-file", required=True, help="record as plain JSON (nullable fields as value or null)")
    ap.add_argument("--key", help="record key; default: the payload's partition_key field")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the ack")
    args = ap.parse_args()
    # A hang anywhere (a registry or broker call without a timeout) must end the process with
    # the stack that hung, not run into the caller's limit with nothing to show.
    faulthandler.dump_traceback_later(getattr(args, "timeout", 30.0) + 15, exit=True)

    with open(args.schema_file, encoding="utf-8") as f:
        schema_str = f.read()
    with open(args.payload_file, encoding="utf-8") as f:
        payload = json.load(f)
    key = args.key if args.key is not None else payload.get("partition_key")
    if key is None:
        print("produce.py: no --key and the payload has no partition_key", file=sys.stderr)
        return 2

    serializer = avro.serializer(SchemaRegistryClient({"url": args.registry}), schema_str)
    subject = avro.subject(args.topic, schema_str)
    try:
        value = serializer(payload, SerializationContext(args.topic, MessageField.VALUE))
    except SchemaRegistryError as e:
        print(f"produce.py: registering/looking up {subject} at {args.registry} failed: {e}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, SerializationError) as e:
        print(f"produce.py: {args.payload_file} does not fit {args.schema_file}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # connection refused, timeouts: the registry is not reachable
        print(f"produce.py: schema registry {args.registry} unreachable while registering {subject}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    schema_id = avro.schema_id(value)

    producer = avro.order_producer(args.bootstrap, message_timeout_ms=int(args.timeout * 1000))
    result = {}

    def on_delivery(err, msg):
        if err is not None:
            result["error"] = err
        else:
            result.update(topic=msg.topic(), partition=msg.partition(), offset=msg.offset())

    try:
        producer.produce(args.topic, key=key.encode("utf-8"), value=value, on_delivery=on_delivery)
    except KafkaException as e:
        print(f"produce.py: produce to {args.topic} failed: {e}", file=sys.stderr)
        return 1
    remaining = producer.flush(args.timeout)
    if "error" in result or remaining:
        reason = result.get("error", f"{remaining} message(s) still in flight after {args.timeout}s")
        print(f"produce.py: {args.topic} did not acknowledge: {reason}", file=sys.stderr)
        return 1
    result.update(subject=subject, schema_id=schema_id)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
