#!/usr/bin/env bash
# Creates or reuses the one Python environment of every harness (bench, chaos, observability,
# interop, the OpenAPI fuzz test, and tests/lint.sh with the harnesses' unit tests) and prints
# the path of its python interpreter on stdout:
#
#     PY=$(tests/venv.sh) && "$PY" tests/chaos/run.py ...
#
# Pinned in tests/requirements.txt; the harnesses' shared code is tests/pylib/stocksvr_harness
# (each entry script puts tests/pylib on its own sys.path, so the environment holds nothing of
# a work tree and several work trees can share it). The environment lives in
# ${HARNESS_VENV:-${STACK_CACHE:-<repo>/.stack/cache}/venv-harness}, built once and kept with
# the stack's other downloads; how it is built and cached: scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=scripts/lib/pyenv.sh
source "$repo/scripts/lib/pyenv.sh"
venv="${HARNESS_VENV:-${STACK_CACHE:-$repo/.stack/cache}/venv-harness}"
pyenv_ready harness "$venv" "$here/requirements.txt" 10 \
    'import confluent_kafka, fastavro, pymysql, redis, requests, matplotlib, yaml, check_jsonschema, schemathesis, pytest, coverage, ruff; from confluent_kafka.schema_registry.avro import AvroSerializer' \
    schemathesis=schemathesis.cli check-jsonschema=check_jsonschema || exit 1
echo "$venv/bin/python"
