#!/usr/bin/env bash
# The path of the schemathesis command of the OpenAPI fuzz test
# (processors/stocksvr/tests/openapi_fuzz.rs), from the harnesses' one environment
# (tests/venv.sh):
#
#     ST=$(tests/api/venv.sh) && "$ST" run --seed 1 http://127.0.0.1:8080/openapi.json
set -euo pipefail
py="$("$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/venv.sh")"
st="$(dirname "$py")/schemathesis"
"$st" --version >/dev/null || { echo "api-venv: schemathesis does not run" >&2; exit 1; }
echo "$st"
