#!/usr/bin/env bash
# Creates or reuses the Python environment of the OpenAPI fuzz test (schemathesis) and prints
# the path of its schemathesis command on stdout:
#
#     ST=$(tests/api/venv.sh) && "$ST" run --seed 1 http://127.0.0.1:8080/openapi.json
#
# The environment lives in ${API_VENV:-${STACK_DIR:-<repo>/.stack}/venv-api}, apart from the
# interop and observability ones so each installs only its own pinned requirements. How it is
# built and cached: scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$repo/scripts/lib/pyenv.sh"
venv="${API_VENV:-${STACK_DIR:-$repo/.stack}/venv-api}"
pyenv_ready api "$venv" "$here/requirements.txt" 10 'import schemathesis' \
    schemathesis=schemathesis.cli
"$venv/bin/schemathesis" --version >/dev/null \
    || { echo "api-venv: schemathesis does not run" >&2; exit 1; }
echo "$venv/bin/schemathesis"
