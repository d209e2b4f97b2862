#!/usr/bin/env bash
# Creates or reuses the Python environment of the observability checks and prints the path of
# its python interpreter on stdout (progress goes to stderr), like tests/interop/venv.sh:
#
#     PY=$(tests/observability/venv.sh) && "$PY" tests/observability/check_compose.py
#
# The environment lives in ${OBS_VENV:-${STACK_DIR:-<repo>/.stack}/venv-observability}, apart
# from the interop one so each installs only its own pinned requirements. Packages are
# installed only when requirements.txt changed since the last successful install (a stamp
# holds its hash), so repeated runs cost nothing and need no network. Falls back to
# `pip install --target` plus a wrapper where `python3 -m venv` does not work (Debian without
# python3-venv). Set PYTHON to pick another interpreter (3.10+).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${OBS_VENV:-${STACK_DIR:-$repo/.stack}/venv-observability}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"

log() { printf 'observability-venv: %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { log "no $python on PATH; install Python 3.10+ or set PYTHON"; exit 1; }
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
    log "$python is $("$python" -V 2>&1); need 3.10+"; exit 1; }

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
        # check_compose.py looks for the CLI next to the interpreter.
        cat >"$venv/bin/check-jsonschema" <<WRAP
#!/bin/sh
exec "$venv/bin/python" -m check_jsonschema "\$@"
WRAP
        chmod +x "$venv/bin/check-jsonschema"
        touch "$venv/.target-install"
    fi
fi

log "installing $(grep -c '^[a-zA-Z]' "$req") pinned packages from requirements.txt"
if [[ -f "$venv/.target-install" ]]; then
    "$python" -m pip install --disable-pip-version-check --upgrade --target "$venv/site" -r "$req" >&2
else
    "$venv/bin/python" -m pip install --disable-pip-version-check -r "$req" >&2
fi
"$venv/bin/python" -c 'import yaml, requests, matplotlib, check_jsonschema' \
    || { log "install finished but the packages do not import"; exit 1; }
echo "$want" >"$stamp"
log "ready: $("$venv/bin/python" -m pip --version 2>/dev/null | cut -d' ' -f1-2 || true)"
echo "$venv/bin/python"
