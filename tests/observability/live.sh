#!/usr/bin/env bash
# The dashboard query check against a real run (issue 13), and with --render the pictures of
# docs/observability/ from the same run. `scripts/test` runs it after run.sh.
#
#   tests/observability/live.sh [--render]
#
# Needs the local stack (`scripts/stack up`) and a built stocksvr: $STOCKSVR_BIN, else
# $CARGO_TARGET_DIR/debug/stocksvr, built here when missing or older than a source file.
# Isolated from everything else on the stack: a database, topic namespace, consumer-group
# prefix, time-wheel namespace and merchant of its own; its own `stocksvr all` and lag
# exporter on free ports and its own Prometheus (Debian's, on a free port, loading
# prometheus/rules/) scraping only them. The shared stack's Prometheus is not used; the
# database, topics and groups are deleted at the end (KEEP=1 keeps them).
#
# 1. healthy: workload.py drives the demo workload for HEALTHY_SECONDS (default 30): Trys
#    through the API, OrderCreated / OrderCreatedFailed / OrderCanceled / RefundRequested
#    through Kafka with the Confluent producer, and once each a scheduled order, a conflict, a
#    deferred refund, a dead letter (replayed by the operator API), a foreign dead letter and
#    bad requests, and one unit of drift written into Redis that the reconciler repairs; then every dashboard query must parse and return at least one series
#    (check_queries.py, retrying empty ones for up to QUERY_WAIT seconds, default 60; report
#    in $OBS_LIVE_DIR/queries.json);
# 2. outage (only with --render): `stocksvr all` is killed (SIGKILL) while the held-back
#    orders' OrderCreated keep arriving for OUTAGE_SECONDS (default 90): the broker-side lag
#    grows, members drop to 0;
# 3. recovery: `stocksvr all` restarts and drains the backlog (RECOVERY_SECONDS, default 60);
#    render_panels.py draws the key panels with the phases shaded.
#
# The lag exporter runs as its own process so it outlives the kill.
# Ends with the query check's "N passed, N failed" and the run's duration; exits 1 when a
# query failed or the workload could not drive the run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

render=0
[ "${1:-}" = "--render" ] && render=1
healthy_s="${HEALTHY_SECONDS:-30}"
outage_s="${OUTAGE_SECONDS:-90}"
recovery_s="${RECOVERY_SECONDS:-60}"
query_wait="${QUERY_WAIT:-60}"
started=$(date +%s)
say() { printf '\n== live: %s (%d s)\n' "$*" "$(( $(date +%s) - started ))" >&2; }

export STACK_DIR="${STACK_DIR:-$repo/.stack}"
scripts/stack status >/dev/null || { echo "live: the stack is not running; scripts/stack up" >&2; exit 1; }
eval "$(scripts/stack env)"
command -v prometheus >/dev/null || { echo "live: no prometheus binary (scripts/stack up installs Debian's)" >&2; exit 1; }
PY="$("$repo/tests/venv.sh")"

target="${CARGO_TARGET_DIR:-$HOME/.cache/stocksvr/target}"
bin="${STOCKSVR_BIN:-$target/debug/stocksvr}"
if [ -z "${STOCKSVR_BIN:-}" ] && { [ ! -x "$bin" ] || [ -n "$(find processors lua migrations -newer "$bin" -type f -print -quit)" ]; }; then
    say "building stocksvr (missing or older than its sources)"
    cargo build -p stocksvr --locked
fi

run_id="obslive_$$_$(date +%s)"
work="${OBS_LIVE_DIR:-$(mktemp -d /tmp/stocksvr-obs-live.XXXXXX)}"
mkdir -p "$work"
read -r svc_port exp_port prom_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
merchant=$(( 700000 + $$ % 100000 )) dish=$(( 800000 + $(date +%s) % 100000 ))
small_dish=$(( dish + 1 ))
# The stack's MariaDB, wherever its port base put it (mysql://user:password@host:port/db).
db_hostport="${STOCKSVR__MYSQL__URL#*@}" db_hostport="${db_hostport%%/*}"
db_admin=(mysql -h"${db_hostport%:*}" -P"${db_hostport##*:}" -ustocksvr -p"${STACK_DB_PASSWORD:-stocksvr}")
say "run $run_id: stocksvr :$svc_port, exporter :$exp_port, prometheus :$prom_port, files in $work"

pids=()
all_pid=
created=0
# shellcheck disable=SC2317  # runs from the EXIT trap below
cleanup() {
    local rc=$?
    for pid in $all_pid "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in $all_pid "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -z "${KEEP:-}" ] && [ "$created" -eq 1 ]; then
        "${db_admin[@]}" -e "DROP DATABASE IF EXISTS \`$run_id\`" 2>/dev/null || true
        "$PY" "$here/workload.py" cleanup --bootstrap "${STOCKSVR__KAFKA__BROKERS:-127.0.0.1:9092}" \
            --namespace "$run_id" >&2 || true
    fi
    # A passing run leaves nothing in /tmp (its Prometheus TSDB and logs are of no further
    # use); a failing run, --render, KEEP or an OBS_LIVE_DIR chosen by the caller keeps them.
    if [ "$rc" -eq 0 ] && [ "$render" -eq 0 ] && [ -z "${KEEP:-}" ] && [ -z "${OBS_LIVE_DIR:-}" ]; then
        rm -rf "$work"
        echo "live: $(( $(date +%s) - started )) s in all; files removed (KEEP=1 keeps them)" >&2
    else
        echo "live: $(( $(date +%s) - started )) s in all; files in $work" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT

wait_http() { # url seconds what [pid]
    local deadline=$(( $(date +%s) + $2 ))
    until curl -fsS -o /dev/null "$1" 2>/dev/null; do
        if [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null; then
            echo "live: $3 exited; its log is in $work" >&2; return 1
        fi
        [ "$(date +%s)" -lt "$deadline" ] || { echo "live: $3 not ready at $1 within $2 s" >&2; return 1; }
        sleep 0.5
    done
}

# --- Prometheus of this run -----------------------------------------------------------------
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  evaluation_interval: 2s
rule_files:
  - $repo/prometheus/rules/*.yml
scrape_configs:
  - job_name: stocksvr
    static_configs:
      - targets: ["127.0.0.1:$svc_port", "127.0.0.1:$exp_port"]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
prom="http://127.0.0.1:$prom_port"
wait_http "$prom/-/ready" 60 prometheus "${pids[-1]}"

# --- this run's database, topics and settings -------------------------------------------------
created=1
"${db_admin[@]}" -e "CREATE DATABASE \`$run_id\` CHARACTER SET utf8mb4"
export STOCKSVR__MYSQL__URL="${STOCKSVR__MYSQL__URL%/*}/$run_id"
export STOCKSVR__KAFKA__TOPIC_NAMESPACE="$run_id"
export STOCKSVR__KAFKA__GROUP_PREFIX="$run_id"
export STOCKSVR__SCHEDULE__WHEEL_NAMESPACE="$run_id"
export STOCKSVR__HTTP__LISTEN="127.0.0.1:$svc_port"
# Lag every 2 s (the scrape interval); the stale watcher every 5 s.
export STOCKSVR__LAG_EXPORTER__INTERVAL_SECS=2
export STOCKSVR__RECOVERY__STALE_INTERVAL_SECS=5
# The reconciler checks every bucket every 2 s and repairs what two passes confirm, so the
# drift injected below is repaired within the run (the repair panels get their data).
export STOCKSVR__RECONCILE__INTERVAL_SECS=2
export STOCKSVR__RECONCILE__AUTO_REPAIR=true
# (A killed member leaves the group after the default 6 s session.) No load balancer watches
# this instance's /readyz, so its stop need not keep serving for the drain grace.
export STOCKSVR__HTTP__DRAIN_GRACE_MS=0
"$bin" migrate >"$work/setup.log" 2>&1
"$bin" topics apply >>"$work/setup.log" 2>&1
"$bin" schemas register >>"$work/setup.log" 2>&1

# --- stocksvr and the exporter ----------------------------------------------------------------
start_all() {
    "$bin" all >>"$work/all.log" 2>&1 &
    all_pid=$!
    wait_http "http://127.0.0.1:$svc_port/readyz" 120 "stocksvr all" "$all_pid"
}
STOCKSVR__HTTP__LISTEN="127.0.0.1:$exp_port" "$bin" lag-exporter >"$work/exporter.log" 2>&1 &
pids+=($!)
start_all
# Today's and tomorrow's bucket (UTC, the merchant's zone): a run across midnight, or the
# scheduled order due a few seconds later, still finds its day.
for day in "$(date -u +%F)" "$(date -u -d tomorrow +%F)"; do
    "$bin" bucket init --merchant-id "$merchant" --dish-id "$dish" --total 1000000 --date "$day" \
        >>"$work/setup.log" 2>&1
done
"$bin" bucket init --merchant-id "$merchant" --dish-id "$small_dish" --total 1 >>"$work/setup.log" 2>&1
# Drift behind the service's back, as an operator's stray write would make it: one unit more
# available in Redis than MySQL accounts for. The reconciler finds it (oversell direction) and
# repairs it once through a REPAIR WAL row and its event.
drift_dish=$(( dish + 2 ))
"$bin" bucket init --merchant-id "$merchant" --dish-id "$drift_dish" --total 10 >>"$work/setup.log" 2>&1
redis-cli -u "$STOCKSVR__REDIS__URL" HINCRBY "inv:{$merchant:$drift_dish:$(date -u +%F)}:stock" available 1 \
    >>"$work/setup.log"

workload() { # phase seconds
    "$PY" "$here/workload.py" "$1" --seconds "$2" --api "http://127.0.0.1:$svc_port" \
        --bootstrap "${STOCKSVR__KAFKA__BROKERS:-127.0.0.1:9092}" \
        --registry "${STOCKSVR__REGISTRY__URL:-http://127.0.0.1:8081/apis/ccompat/v7}" \
        --namespace "$run_id" --run-id "$run_id" --merchant "$merchant" --dish "$dish" \
        --small-dish "$small_dish" --held "$work/held.json"
}

t0=$(date +%s)
say "healthy workload for $healthy_s s"
workload healthy "$healthy_s"
say "query check against $prom"
set +e
"$PY" "$here/check_queries.py" --prometheus "$prom" --wait "$query_wait" \
    --report "$work/queries.json" | tee "$work/queries.txt"
check_rc=${PIPESTATUS[0]}
set -e

if [ "$render" -eq 1 ]; then
    say "outage: SIGKILL stocksvr all; order events keep arriving for $outage_s s"
    kill -KILL "$all_pid"; wait "$all_pid" 2>/dev/null || true; all_pid=
    t2=$(date +%s)
    workload outage "$outage_s"
    t3=$(date +%s)
    say "recovery: stocksvr all restarts and drains the backlog; healthy workload for $recovery_s s"
    start_all
    workload healthy "$recovery_s"
    t4=$(date +%s)
    echo "t0=$t0 t2=$t2 t3=$t3 t4=$t4" >"$work/phases.txt"
    "$PY" "$here/render_panels.py" --prometheus "$prom" --start "$t0" --end "$t4" --step 2 \
        --phase "$t0:$t2:healthy" --phase "$t2:$t3:stocksvr all killed" \
        --phase "$t3:$t4:restarted" \
        --title "stocksvr key panels: healthy, stocksvr all killed (lag exporter alone), restarted"
    # Which alerts the run's Prometheus fired, for the record.
    curl -fsS "$prom/api/v1/alerts" >"$work/alerts.json" || true
fi
say "done"
exit "$check_rc"
