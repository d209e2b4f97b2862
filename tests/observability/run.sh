#!/usr/bin/env bash
# The observability checks that need no running stocksvr (issue 13):
#   1. promtool check config / check rules, and promtool test rules prometheus/tests/*.yml
#      (one firing and one quiet case per alert);
#   2. the dashboards are what dashboards.py generates, and lint_dashboards.py passes
#      (ids, units, datasource, expressions, every metric in prometheus/metrics-catalog.json,
#      and with promql.py the labels, label values and legends against the catalog);
#   3. lint_rules.py: severities, annotations, runbook sections, a firing and a quiet case each,
#      labels and values of expressions and promtool input series against the catalog;
#   4. check_compose.py: docker-compose.yml against the Compose specification schema, and
#      every file it mounts exists.
# The query check against a live Prometheus is separate: tests/observability/live.sh.
#
# promtool comes from Debian's prometheus package, which `scripts/stack up` installs.
# Ends with "N passed, N failed"; exits 1 when a step failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo" || exit 1

passed=0 failed=0 failures=()
step() { # name command...
    local name="$1"; shift
    printf '\n== observability: %s\n' "$name"
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
}

if ! command -v promtool >/dev/null; then
    echo "observability: promtool not found; scripts/stack up installs Debian's prometheus package, which ships it" >&2
    exit 1
fi
PY="$("$repo/tests/venv.sh")" || { echo "observability: the Python environment could not be set up" >&2; exit 1; }

step "promtool check config (stack and compose)" \
    promtool check config prometheus/prometheus.yml prometheus/prometheus.docker.yml
step "promtool check rules" promtool check rules prometheus/rules/*.yml
step "promtool test rules" promtool test rules prometheus/tests/*.yml
step "dashboards are generated" python3 "$here/dashboards.py" --check
step "lint dashboards" python3 "$here/lint_dashboards.py"
step "lint rules" "$PY" "$here/lint_rules.py"
step "compose" "$PY" "$here/check_compose.py"

echo
[ "$failed" -eq 0 ] || printf 'observability: failed: %s\n' "${failures[@]}"
echo "observability: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
