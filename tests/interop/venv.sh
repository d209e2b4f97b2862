#!/usr/bin/env bash
# Creates or reuses the Python environment of the interop tests (confluent-kafka with its Avro
# serializer) and prints the path of its python interpreter on stdout, so callers can do:
#
#     PY=$(tests/interop/venv.sh) && "$PY" tests/interop/produce.py ...
#
# The environment lives in ${STACK_DIR:-<repo>/.stack}/venv; how it is built and cached:
# scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$repo/scripts/lib/pyenv.sh"
venv="${STACK_DIR:-$repo/.stack}/venv"
pyenv_ready interop "$venv" "$here/requirements.txt" 8 \
    'import confluent_kafka, fastavro; from confluent_kafka.schema_registry.avro import AvroSerializer'
echo "$venv/bin/python"
