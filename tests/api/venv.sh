#!/usr/bin/env bash
# Creates or reuses the Python environment of the OpenAPI fuzz test (schemathesis) and prints
# the path of its schemathesis command on stdout (progress goes to stderr):
#
#     ST=$(tests/api/venv.sh) && "$ST" run --seed 1 http://127.0.0.1:8080/openapi.json
#
# The environment lives in ${API_VENV:-${STACK_DIR:-<repo>/.stack}/venv-api}, apart from the
# interop and observability ones so each installs only its own pinned requirements. Packages
# are installed only when requirements.txt changed since the last successful install (a stamp
# holds its hash), so repeated runs cost nothing and need no network; the wheels are kept in
# ${STACK_DIR:-<repo>/.stack}/cache/api-wheels, so rebuilding the environment downloads
# nothing either (pip's own HTTP cache does not survive here). Falls back to `pip install --target` plus wrappers where `python3 -m venv` does not
# work (Debian without python3-venv). Set PYTHON to pick another interpreter (3.10+).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
stack_dir="${STACK_DIR:-$repo/.stack}"
venv="${API_VENV:-$stack_dir/venv-api}"
req="$here/requirements.txt"
python="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"
wheels="${STACK_CACHE:-$stack_dir/cache}/api-wheels"

log() { printf 'api-venv: %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { log "no $python on PATH; install Python 3.10+ or set PYTHON"; exit 1; }
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
    log "$python is $("$python" -V 2>&1); need 3.10+"; exit 1; }

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/schemathesis" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv/bin/schemathesis"
    exit 0
fi

mkdir -p "$(dirname "$venv")" "$wheels"
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
        cat >"$venv/bin/schemathesis" <<WRAP
#!/bin/sh
exec "$venv/bin/python" -m schemathesis.cli "\$@"
WRAP
        chmod +x "$venv/bin/python" "$venv/bin/schemathesis"
        touch "$venv/.target-install"
    fi
fi

if [[ -f "$venv/.target-install" ]]; then
    pip_install() { "$python" -m pip install --disable-pip-version-check --upgrade --target "$venv/site" "$@"; }
else
    pip_install() { "$venv/bin/python" -m pip install --disable-pip-version-check "$@"; }
fi
# From the kept wheels first; download only what they lack (pip download skips files it has).
if ! pip_install --no-index --find-links "$wheels" -r "$req" >&2 2>/dev/null; then
    log "downloading $(grep -c '^[a-zA-Z]' "$req") pinned packages into $wheels"
    "$venv/bin/python" -m pip download --disable-pip-version-check --dest "$wheels" -r "$req" >&2
    pip_install --no-index --find-links "$wheels" -r "$req" >&2
fi
"$venv/bin/schemathesis" --version >&2 \
    || { log "install finished but schemathesis does not run"; exit 1; }
echo "$want" >"$stamp"
echo "$venv/bin/schemathesis"
