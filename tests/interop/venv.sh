#!/usr/bin/env bash
# Creates or reuses the Python environment for the interop tests and prints the path of its
# python interpreter on stdout (progress goes to stderr), so callers can do:
#
#     PY=$(tests/interop/venv.sh) && "$PY" tests/interop/produce.py ...
#
# The environment lives in ${STACK_DIR:-<repo>/.stack}/venv. Requirements are installed only
# when requirements.txt changed since the last successful install (a stamp holds its hash),
# so repeated runs cost nothing and need no network.
#
# Works on a fresh machine: uses `python3 -m venv` when it works (Debian needs python3-venv
# for that), otherwise falls back to `pip install --target` plus a small wrapper script.
# Set PYTHON to pick another interpreter (3.8+).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
stack_dir="${STACK_DIR:-$repo/.stack}"
venv="$stack_dir/venv"
req="$here/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"

log() { printf 'interop-venv: %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { log "no $python on PATH; install Python 3.8+ or set PYTHON"; exit 1; }
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' || {
    log "$python is $("$python" -V 2>&1); need 3.8+"; exit 1; }

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv/bin/python"
    exit 0
fi

mkdir -p "$stack_dir"
if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $("$python" -V 2>&1)"
    if ! "$python" -m venv "$venv" >&2 2>&1; then
        # Typically Debian/Ubuntu without python3-venv (no ensurepip). Install into a plain
        # directory instead and put a wrapper where the venv's python would be.
        log "'$python -m venv' failed; falling back to pip install --target"
        rm -rf "$venv"
        "$python" -m pip --version >/dev/null 2>&1 || {
            log "neither venv nor pip works for $python (on Debian: apt-get install python3-venv)"; exit 1; }
        mkdir -p "$venv/bin" "$venv/site"
        real="$(command -v "$python")"
        cat >"$venv/bin/python" <<EOF
#!/bin/sh
PYTHONPATH="$venv/site\${PYTHONPATH:+:\$PYTHONPATH}" exec "$real" "\$@"
EOF
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
"$venv/bin/python" -c 'import confluent_kafka, fastavro; from confluent_kafka.schema_registry.avro import AvroSerializer' \
    || { log "install finished but confluent_kafka does not import"; exit 1; }
echo "$want" >"$stamp"
log "ready: confluent-kafka $("$venv/bin/python" -c 'import confluent_kafka; v = confluent_kafka.version(); print(v if isinstance(v, str) else v[0])')"
echo "$venv/bin/python"
