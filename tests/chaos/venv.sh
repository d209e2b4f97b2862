#!/usr/bin/env bash
# Creates or reuses the Python environment of the fault-injection suite and prints the path of
# its python interpreter on stdout:
#
#     PY=$(tests/chaos/venv.sh) && "$PY" tests/chaos/run.py ...
#
# The environment lives in $STACK_CACHE/venv-chaos (default <repo>/.stack/cache/venv-chaos),
# not in the run's STACK_DIR: every chaos run has a fresh private stack folder under /tmp,
# while the environment should be built once. How it is built: scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$repo/scripts/lib/pyenv.sh"
venv="${STACK_CACHE:-$repo/.stack/cache}/venv-chaos"
pyenv_ready chaos "$venv" "$here/requirements.txt" 9 \
    'import confluent_kafka, fastavro, pymysql, redis, requests; from confluent_kafka.schema_registry.avro import AvroSerializer'
echo "$venv/bin/python"
