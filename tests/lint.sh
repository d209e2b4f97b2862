#!/usr/bin/env bash
# The harnesses' safety net: lint of every Python and shell file of the repository and the
# unit tests of the harness code (the chaos checker, the replay comparison, the bench's
# figures, the PromQL lint helpers, the shared package), with their line coverage.
#
#   tests/lint.sh              ruff check, shellcheck, pytest with coverage
#   tests/lint.sh --no-cov     the same without coverage (faster)
#
# Python tools come pinned from the one environment (tests/venv.sh: ruff, pytest, coverage;
# settings in tests/pyproject.toml); shellcheck from Debian (scripts/lib/tools.sh installs it).
# Each suite's tests run in a pytest process of their own: the suites are flat module folders
# whose names overlap (chaos/system.py, bench/system.py). Ends with "N passed, N failed" over
# the steps; exits 1 when one failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo" || exit 1
cov=1
[[ ${1:-} == --no-cov ]] && cov=0

# shellcheck source=scripts/lib/tools.sh
source "$repo/scripts/lib/tools.sh"
PY="$("$here/venv.sh")" || { echo "lint: the Python environment could not be set up" >&2; exit 1; }
tools_ensure shellcheck || exit 1

passed=0 failed=0 failures=()
step() { # name command...
    local name="$1"; shift
    printf '\n== lint: %s\n' "$name"
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
}

# Every shell script the repository tracks: by name (*.sh) or by a bash shebang.
shell_files() {
    git ls-files -z | while IFS= read -r -d '' f; do
        [[ -f $f ]] || continue
        if [[ $f == *.sh ]] || head -n 1 "$f" | grep -Eq '^#!.*\b(ba)?sh\b'; then printf '%s\n' "$f"; fi
    done
}

# Findings left in files another change owns, excluded for that file only (each is listed
# in the report of the change that added the exclusion; remove it once the file is clean).
# Empty now; the form is SHELLCHECK_EXCLUDE=([path]="SC2015,SC2086").
declare -A SHELLCHECK_EXCLUDE=()

shellcheck_all() { # one shellcheck for the clean files, one per file with exclusions
    local f rc=0
    local -a plain=()
    while IFS= read -r f; do
        if [[ -n ${SHELLCHECK_EXCLUDE[$f]:-} ]]; then
            shellcheck -x -e "${SHELLCHECK_EXCLUDE[$f]}" "$f" || rc=1
        else
            plain+=("$f")
        fi
    done < <(shell_files)
    shellcheck -x "${plain[@]}" || rc=1
    return "$rc"
}

unit_tests() {
    local suite rc=0
    local -a run=("$PY" -m pytest -q)
    if (( cov )); then
        rm -f "$here/.coverage" "$here"/.coverage.*
        run=("$PY" -m coverage run --rcfile="$here/pyproject.toml" --data-file="$here/.coverage" -p -m pytest -q)
    fi
    # From tests/: pytest and coverage read tests/pyproject.toml there.
    for suite in pylib chaos bench observability ci soak; do
        (cd "$here" && "${run[@]}" "$suite") || rc=1
    done
    if (( cov )); then
        (cd "$here" && "$PY" -m coverage combine -q --rcfile=pyproject.toml --data-file=.coverage \
            && "$PY" -m coverage report --rcfile=pyproject.toml --data-file=.coverage) || rc=1
        rm -f "$here/.coverage" "$here"/.coverage.*
    fi
    return "$rc"
}

ruff_all() { # from tests/, where ruff finds tests/pyproject.toml (its src paths are relative to it)
    (cd "$here" && "$PY" -m ruff check .)
}

step "ruff check (tests/pyproject.toml)" ruff_all
step "shellcheck ($(shell_files | wc -l) scripts)" shellcheck_all
step "unit tests of the harnesses" unit_tests

echo
[[ $failed -eq 0 ]] || printf 'lint: failed: %s\n' "${failures[@]}"
echo "lint: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
