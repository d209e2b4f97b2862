#!/usr/bin/env bash
# The interop tests' Python (confluent-kafka with its Avro serializer): the harnesses' one
# environment (tests/venv.sh). Kept at this path for the Rust tests that call it
# (processors/stocksvr/tests/python_interop.rs, order_flow.rs):
#
#     PY=$(tests/interop/venv.sh) && "$PY" tests/interop/produce.py ...
set -euo pipefail
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/venv.sh"
