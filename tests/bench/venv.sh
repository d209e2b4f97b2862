#!/usr/bin/env bash
# Creates or reuses the Python environment of scripts/bench and prints the path of its python
# interpreter on stdout (progress goes to stderr):
#
#     PY=$(tests/bench/venv.sh) && "$PY" tests/bench/run.py ...
#
# Same mechanism as tests/interop/venv.sh (venv, or pip --target plus a wrapper where Debian
# lacks python3-venv; reinstalled only when requirements.txt changes, so a second run needs no
# network), with its own requirements.txt. The environment lives in $BENCH_VENV (default
# <repo>/bench-results/.cache/venv, git-ignored with the results).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${BENCH_VENV:-$repo/bench-results/.cache/venv}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"

log() { printf 'bench-venv: %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { log "no $python on PATH; install Python 3.9+ or set PYTHON"; exit 1; }
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' || {
    log "$python is $("$python" -V 2>&1); need 3.9+"; exit 1; }

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$venv")"
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $("$python" -V 2>&1)"
    if ! "$python" -m venv "$venv" >&2 2>&1; then
        log "'$python -m venv' failed; falling back to pip install --target"
        rm -rf "$venv"
        "$python" -m pip --version >/dev/null 2>&1 || {
            log "neither venv nor pip works for $python (on Debian: apt-get install python3-venv)"; exit 1; }
        mkdir -p "$venv/bin" "$venv/site"
        real="$(command -v "$python")"
        cat >"$venv/bin/python" <<WRAP
#!/bin/sh
PYTHONPATH="$venv/site\${PYTHONPATH:+:\$PYTHONPATH}" exec "$real" "\$@"
WRAP
        chmod +x "$venv/bin/python"
        touch "$venv/.target-install"
    fi
fi

log "installing $(grep -c '^[a-zA-Z]' "$req") pinned packages from requirements.txt"
if [[ -f "$venv/.target-install" ]]; then
    "$python" -m pip install --disable-pip-version-check --upgrade --target "$venv/site" -r "$req" >&2
else
    "$venv/bin/python" -m pip install --disable-pip-version-check -r "$req" >&2
fi
"$venv/bin/python" -c 'import confluent_kafka, fastavro, pymysql, redis, matplotlib; from confluent_kafka.schema_registry.avro import AvroSerializer' \
    || { log "install finished but the packages do not import"; exit 1; }
echo "$want" >"$stamp"
log "ready: $("$venv/bin/python" -V 2>&1)"
echo "$venv/bin/python"
