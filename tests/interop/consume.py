#!/usr/bin/env python3
"""Read exactly one Avro record at a given position, as a Python consumer of stocksvr would.

Decodes with confluent-kafka's AvroDeserializer without a reader schema, i.e. with the writer
schema fetched from the registry by the id in the Confluent wire-format prefix. This proves
that what stocksvr (or produce.py) wrote is readable by the stock client.

Prints the record value as one JSON line (nullable fields as plain value or null, enums as
their symbol), or with --meta: {"key", "partition", "offset", "schema_id", "value"}.
Exits 1 with a message on stderr if nothing is at that position within --timeout seconds.

Example:
  consume.py --topic order.lifecycle.v1 --partition 3 --offset 17
"""

import argparse
import faulthandler
import json
import os
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from stocksvr_harness import avro


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7",
                    help="schema.registry.url (Apicurio: .../apis/ccompat/v7)")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partition", type=int, required=True)
    ap.add_argument("--offset", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the record")
    ap.add_argument("--meta", action="store_true", help="wrap the value with key, position and schema id")
    args = ap.parse_args()
    # A hang anywhere (a registry or broker call without a timeout) must end the process with
    # the stack that hung, not run into the caller's limit with nothing to show.
    faulthandler.dump_traceback_later(getattr(args, "timeout", 30.0) + 15, exit=True)

    # The writer schema comes by the id in the record's prefix; the subject only names it.
    # Without a strategy the client asks the registry for the topic's "associations" first,
    # an endpoint Apicurio's Confluent API does not serve, and that request once hung for the
    # whole timeout: name the strategy stocksvr uses, and bound every registry request.
    deserializer = AvroDeserializer(
        SchemaRegistryClient({"url": args.registry, "timeout": 10}),
        conf={"subject.name.strategy.type": "TOPIC_RECORD"},
    )
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        # Positioned by assign(), never committed: a throwaway group keeps it out of real groups.
        "group.id": f"stocksvr-interop-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "isolation.level": "read_committed",
        # An offset past the end must fail now with a clear message, not silently jump to END.
        "auto.offset.reset": "error",
    })
    where = f"{args.topic}[{args.partition}]@{args.offset}"

    def watermarks():
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(args.topic, args.partition), timeout=5)
            return f" (partition holds offsets {low}..{high - 1})" if high > low else " (partition is empty)"
        except Exception as e:  # the main message matters more than the hint
            return f" (watermarks unavailable: {e})"

    try:
        consumer.assign([TopicPartition(args.topic, args.partition, args.offset)])
        deadline = time.monotonic() + args.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"consume.py: no record at {where} within {args.timeout}s{watermarks()}", file=sys.stderr)
                return 1
            msg = consumer.poll(min(left, 1.0))
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # may still be propagating; the deadline decides
                if msg.error().code() == KafkaError._AUTO_OFFSET_RESET:
                    print(f"consume.py: no record at {where}: offset out of range{watermarks()}", file=sys.stderr)
                    return 1
                print(f"consume.py: {where}: {msg.error()}", file=sys.stderr)
                return 1
            if msg.offset() != args.offset:
                print(f"consume.py: asked for {where} but the next record is at offset {msg.offset()}"
                      " (deleted, compacted or a transaction marker)", file=sys.stderr)
                return 1
            raw = msg.value()
            value = deserializer(raw, SerializationContext(args.topic, MessageField.VALUE))
            if args.meta:
                key = msg.key()
                out = {
                    "key": key.decode("utf-8") if key is not None else None,
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "schema_id": avro.schema_id(raw),
                    "value": value,
                }
            else:
                out = value
            print(json.dumps(out, ensure_ascii=False))
            return 0
    finally:
        # close() can block for minutes waiting on a group coordinator this throwaway
        # consumer never joined (seen once under load); it commits nothing, so give it a
        # few seconds in a helper thread and then let the process exit regardless.
        sys.stdout.flush()
        closer = threading.Thread(target=consumer.close, daemon=True)
        closer.start()
        closer.join(5)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: a daemon thread still inside librdkafka must not hold the interpreter open.
    os._exit(code)
