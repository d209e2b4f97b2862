#!/usr/bin/env bash
# Creates or reuses the Python environment of scripts/bench and prints the path of its python
# interpreter on stdout:
#
#     PY=$(tests/bench/venv.sh) && "$PY" tests/bench/run.py ...
#
# The environment lives in $BENCH_VENV (default <repo>/bench-results/.cache/venv, git-ignored
# with the results); how it is built and cached: scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$repo/scripts/lib/pyenv.sh"
venv="${BENCH_VENV:-$repo/bench-results/.cache/venv}"
pyenv_ready bench "$venv" "$here/requirements.txt" 9 \
    'import confluent_kafka, fastavro, pymysql, redis, matplotlib; from confluent_kafka.schema_registry.avro import AvroSerializer'
echo "$venv/bin/python"
