# shellcheck shell=bash
# Sourced, not run: Debian packages a script of the project needs, installed when missing (as
# root, like scripts/stack installs the servers), so a fresh machine gets them on the first
# run and later runs find them in place.
#
#   source scripts/lib/tools.sh
#   tools_ensure shellcheck            # COMMAND[=PACKAGE] ...; returns 1 if one is missing
#   tools_ensure_build                 # what `cargo build` of stocksvr needs from Debian
#
# Progress goes to stderr.

tools_ensure() {
    local want cmd pkg
    local -a missing=()
    for want in "$@"; do
        cmd="${want%%=*}" pkg="${want#*=}"
        command -v "$cmd" >/dev/null || missing+=("$pkg")
    done
    tools_install "${missing[@]}"
}

# rdkafka's `ssl` feature builds librdkafka against the system OpenSSL (TLS and SASL SCRAM to
# Kafka), which it finds through pkg-config: both must be there before cargo starts.
tools_ensure_build() {
    local -a missing=()
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    [[ -f /usr/include/openssl/ssl.h ]] || missing+=(libssl-dev)
    tools_install "${missing[@]}"
}

# tools_install PACKAGE...: apt-get install them (as root); nothing to do without packages.
tools_install() {
    local -a missing=("$@")
    (( ${#missing[@]} == 0 )) && return 0
    if (( EUID != 0 )); then
        printf 'tools: missing %s; run as root or: apt-get install %s\n' "${missing[*]}" "${missing[*]}" >&2
        return 1
    fi
    printf 'tools: apt-get install %s\n' "${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null &&
        apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${missing[@]}" >/dev/null; } || {
        printf 'tools: apt-get install %s failed\n' "${missing[*]}" >&2
        return 1
    }
}
