# shellcheck shell=bash
# Sourced, not run: the `stocksvr` binary of an earlier revision, for the chaos suite's upgrade
# run (issue 51: instances of the previous release rolled to this one while orders flow).
#
#   source scripts/lib/previous-release.sh
#   bin="$(previous_release_bin "$STACK_CACHE" [REV])"   # REV default: PREVIOUS_RELEASE
#
# The binary is built once per revision and kept as $cache/stocksvr-<full rev>; later runs (and
# CI on the same machine) find it there. The build takes the revision's files with
# `git archive` (the repository's history must hold it: a shallow clone does not), in a target
# directory of its own: sharing this tree's would overwrite its target/release/stocksvr. The
# sources and the target directory are removed once the binary is saved (a few GB); the first
# build on a machine therefore takes a full release build (10-20 min on 2 cores).
# Progress goes to stderr.

# The release an upgrade is tested from: the main of 2026-12-06 that issues 47-52 were measured
# on, before the one-row outbox, the reached bits and the Avro outbox body
# (docs/operations.md, "Upgrading", lists what changed since). Move it forward at each release.
PREVIOUS_RELEASE=03cc91d699cc2bf7364c969c5bd2dbc9ff8c480e

previous_release_bin() {
    local cache="$1" rev="${2:-$PREVIOUS_RELEASE}" repo full out work
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    if ! full="$(git -C "$repo" rev-parse --verify --quiet "$rev^{commit}")"; then
        echo "previous release: revision $rev is not in this repository's history (a shallow clone? fetch it, or pass --upgrade-from REV)" >&2
        return 1
    fi
    out="$cache/stocksvr-$full"
    if [[ -x $out ]]; then
        echo "previous release: $out (built before)" >&2
        echo "$out"
        return 0
    fi
    work="$cache/previous-release-build"
    rm -rf "$work"
    mkdir -p "$work/src"
    echo "previous release: building stocksvr at ${full:0:12} in $work (once per revision)" >&2
    git -C "$repo" archive "$full" | tar -x -C "$work/src" || return 1
    if ! (cd "$work/src" && CARGO_TARGET_DIR="$work/target" CARGO_INCREMENTAL=0 \
        cargo build --release --locked -p stocksvr) >&2; then
        echo "previous release: the build of ${full:0:12} failed (its output is above)" >&2
        return 1
    fi
    cp "$work/target/release/stocksvr" "$out.tmp" && mv "$out.tmp" "$out"
    rm -rf "$work"
    echo "previous release: $out" >&2
    echo "$out"
}
