#!/usr/bin/env python3
"""Send every schemas/examples/*.json through produce.py and read it back with consume.py.

Runs the two scripts as separate processes, exactly as a test or an operator would, and checks
that (1) the stock Confluent serializer accepts each example with its schema, (2) the schema is
registered under `<topic>-<record full name>`, and (3) the stock deserializer, using only the
writer schema from the registry, returns the example unchanged.

By default each event goes to its own topic from schemas/catalog.yaml (the topics must exist);
--topic sends everything to one scratch topic instead, created if missing (subjects are then
`<that topic>-...`), which leaves the real topics untouched for the processors.
Exits 1 if any example fails.
"""

import argparse
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from stocksvr_harness import SCHEMAS, kafka

HERE = os.path.dirname(os.path.abspath(__file__))


def catalog():
    """name -> (topic, file) from the flat list in catalog.yaml (no YAML dependency)."""
    rows, row = [], None
    with open(os.path.join(SCHEMAS, "catalog.yaml"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line == "events:":
                continue
            if line.startswith("- "):
                row = {}
                rows.append(row)
                line = line[2:]
            k, v = line.split(":", 1)
            row[k.strip()] = v.strip()
    return {r["file"][: -len(".avsc")]: r for r in rows}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    # The scripts' own message is their last stderr line; librdkafka may log above it.
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    return p.returncode, p.stdout.strip(), lines[-1] if lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7")
    ap.add_argument("--topic", help="one scratch topic for all examples instead of the catalog topics")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    events = catalog()
    if args.topic and kafka.create_topic(args.bootstrap, args.topic, partitions=3, exist_ok=True):
        print(f"created topic {args.topic} (3 partitions)")
    examples_dir = os.path.join(SCHEMAS, "examples")
    failures = 0
    for name in sorted(os.listdir(examples_dir)):
        if not name.endswith(".json"):
            continue
        event = name.split(".", 1)[0]
        entry = events[event]
        topic = args.topic or entry["topic"]
        payload_file = os.path.join(examples_dir, name)
        schema_file = os.path.join(SCHEMAS, entry["file"])
        with open(payload_file, encoding="utf-8") as f:
            expected = json.load(f)

        rc, out, err = run([sys.executable, os.path.join(HERE, "produce.py"),
                            "--bootstrap", args.bootstrap, "--registry", args.registry,
                            "--topic", topic, "--schema-file", schema_file,
                            "--payload-file", payload_file, "--timeout", str(args.timeout)])
        if rc != 0:
            print(f"FAIL {name}: produce: {err or out}")
            failures += 1
            continue
        pos = json.loads(out)
        want_subject = f"{topic}-{entry['name']}"
        if pos["subject"] != want_subject:
            print(f"FAIL {name}: subject {pos['subject']} != {want_subject}")
            failures += 1
            continue
        subject_url = f"{args.registry}/subjects/{urllib.parse.quote(want_subject, safe='')}/versions/latest"
        try:
            with urllib.request.urlopen(subject_url, timeout=10) as r:
                registered = json.load(r)
        except Exception as e:
            print(f"FAIL {name}: registry has no {want_subject}: {e}")
            failures += 1
            continue

        rc, out, err = run([sys.executable, os.path.join(HERE, "consume.py"),
                            "--bootstrap", args.bootstrap, "--registry", args.registry,
                            "--topic", pos["topic"], "--partition", str(pos["partition"]),
                            "--offset", str(pos["offset"]), "--timeout", str(args.timeout), "--meta"])
        if rc != 0:
            print(f"FAIL {name}: consume: {err or out}")
            failures += 1
            continue
        got = json.loads(out)
        problems = []
        if got["value"] != expected:
            problems.append(f"value differs: {json.dumps(got['value'])}")
        if got["key"] != expected["partition_key"]:
            problems.append(f"key {got['key']!r} != partition_key {expected['partition_key']!r}")
        if got["schema_id"] != pos["schema_id"]:
            problems.append(f"schema id {got['schema_id']} != produced {pos['schema_id']}")
        if problems:
            print(f"FAIL {name}: " + "; ".join(problems))
            failures += 1
            continue
        print(f"ok   {name}: {pos['topic']}[{pos['partition']}]@{pos['offset']} "
              f"subject={want_subject} id={pos['schema_id']} version={registered.get('version')}")
    print(f"{'FAILED' if failures else 'PASSED'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
