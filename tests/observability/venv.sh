#!/usr/bin/env bash
# Creates or reuses the Python environment of the observability checks (PyYAML, requests,
# matplotlib, check-jsonschema) and prints the path of its python interpreter on stdout:
#
#     PY=$(tests/observability/venv.sh) && "$PY" tests/observability/check_compose.py
#
# The environment lives in ${OBS_VENV:-${STACK_DIR:-<repo>/.stack}/venv-observability}; how it
# is built and cached: scripts/lib/pyenv.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$repo/scripts/lib/pyenv.sh"
venv="${OBS_VENV:-${STACK_DIR:-$repo/.stack}/venv-observability}"
# check_compose.py looks for the check-jsonschema CLI next to the interpreter.
pyenv_ready observability "$venv" "$here/requirements.txt" 10 \
    'import yaml, requests, matplotlib, check_jsonschema' check-jsonschema=check_jsonschema
echo "$venv/bin/python"
