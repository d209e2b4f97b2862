# shellcheck shell=bash
# Sourced, not run: how the project builds a pinned, git-ignored Python environment. Its one
# caller is tests/venv.sh (the environment of every harness: bench, chaos, observability,
# interop, the OpenAPI fuzz test, and the harnesses' unit tests and lint).
#
#   source scripts/lib/pyenv.sh
#   pyenv_ready NAME VENV REQUIREMENTS MIN_MINOR IMPORTS [CLI=MODULE ...] || exit 1
#   echo "$VENV/bin/python"
#
# Callers at the same moment (cargo runs test binaries in parallel, each asking for the
# environment) wait for each other on a lock beside VENV: one builds, the others find it ready.
#
# Packages are installed only when REQUIREMENTS changed since the last successful install (a
# stamp holds its hash), so repeated runs cost nothing and need no network. Wheels are kept in
# ${STACK_CACHE:-<repo>/.stack/cache}/wheels, so a rebuilt environment downloads nothing either.
# Uses `python3 -m venv` when it works; Debian without python3-venv gets `pip install --target`
# plus a wrapper where the venv's python would be (and one per CLI=MODULE, for the commands a
# venv would have put in bin/). Set PYTHON to pick another interpreter. Progress goes to stderr.

pyenv_ready() {
    local name="$1" venv="$2" req="$3" minor="$4" imports="$5"
    shift 5
    local clis=("$@")
    local repo python stamp want wheels real cli
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    python="${PYTHON:-python3}"
    stamp="$venv/.requirements.sha256"
    wheels="${STACK_CACHE:-$repo/.stack/cache}/wheels"
    _pyenv_log() { printf '%s-venv: %s\n' "$name" "$*" >&2; }

    command -v "$python" >/dev/null || { _pyenv_log "no $python on PATH; install Python 3.$minor+ or set PYTHON"; return 1; }
    "$python" -c "import sys; sys.exit(0 if sys.version_info >= (3, $minor) else 1)" || {
        _pyenv_log "$python is $("$python" -V 2>&1); need 3.$minor+"; return 1; }

    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi

    mkdir -p "$(dirname "$venv")" "$wheels"
    # The lock is held by this subshell's descriptor 9 until pyenv_ready returns.
    exec 9>"$venv.lock"
    flock 9
    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        exec 9>&-
        return 0
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        _pyenv_log "creating $venv with $("$python" -V 2>&1)"
        if ! "$python" -m venv "$venv" >&2 2>&1; then
            _pyenv_log "'$python -m venv' failed; falling back to pip install --target"
            rm -rf "$venv"
            "$python" -m pip --version >/dev/null 2>&1 || {
                _pyenv_log "neither venv nor pip works for $python (on Debian: apt-get install python3-venv)"; return 1; }
            mkdir -p "$venv/bin" "$venv/site"
            real="$(command -v "$python")"
            # shellcheck disable=SC2016  # $PYTHONPATH and $@ belong to the wrapper, not to us
            printf '#!/bin/sh\nPYTHONPATH="%s/site${PYTHONPATH:+:$PYTHONPATH}" exec "%s" "$@"\n' \
                "$venv" "$real" >"$venv/bin/python"
            chmod +x "$venv/bin/python"
            for cli in ${clis[@]+"${clis[@]}"}; do
                printf '#!/bin/sh\nexec "%s/bin/python" -m %s "$@"\n' "$venv" "${cli#*=}" >"$venv/bin/${cli%%=*}"
                chmod +x "$venv/bin/${cli%%=*}"
            done
            touch "$venv/.target-install"
        fi
    fi

    _pyenv_pip() {
        if [[ -f "$venv/.target-install" ]]; then
            "$python" -m pip install --disable-pip-version-check --upgrade --target "$venv/site" "$@"
        else
            "$venv/bin/python" -m pip install --disable-pip-version-check "$@"
        fi
    }
    # From the kept wheels first; download only what they lack (pip download skips what it has).
    if ! _pyenv_pip --no-index --find-links "$wheels" -r "$req" >&2 2>/dev/null; then
        _pyenv_log "downloading $(grep -c '^[a-zA-Z]' "$req") pinned packages into $wheels"
        "$venv/bin/python" -m pip download --disable-pip-version-check --dest "$wheels" -r "$req" >&2 || return 1
        _pyenv_pip --no-index --find-links "$wheels" -r "$req" >&2 || return 1
    fi
    "$venv/bin/python" -c "$imports" || { _pyenv_log "install finished but the packages do not import"; return 1; }
    echo "$want" >"$stamp"
    exec 9>&-
    _pyenv_log "ready: $("$venv/bin/python" -V 2>&1), $(grep -c '^[a-zA-Z]' "$req") pinned packages"
}
