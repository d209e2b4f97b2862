#!/usr/bin/env bash
# The dashboard query check against a real run (issue 13), and with --render the pictures of
# docs/observability/ from the same run.
#
#   tests/observability/live.sh [--render]
#
# Needs the local stack (`scripts/stack up`) and a built stocksvr (built here when missing).
# Isolated from everything else on the stack: its own database, consumer group prefix and
# merchant, its own stocksvr on a free port and its own Prometheus (Debian's, on a free port,
# loading prometheus/rules/) scraping only this run. The shared stack's Prometheus is not used.
#
# 1. healthy: Trys through the API, OrderCreated / OrderCreatedFailed through Kafka
#    (HEALTHY_SECONDS, default 120); then every dashboard query must parse and return at
#    least one series (check_queries.py; report in $OBS_LIVE_DIR/queries.json);
# 2. outage (only with --render): `stocksvr all` is killed (SIGKILL) while order events keep
#    arriving for OUTAGE_SECONDS (default 90): the broker-side lag grows, members drop to 0;
# 3. recovery: `stocksvr all` restarts and drains the backlog (RECOVERY_SECONDS, default 60);
#    render_panels.py draws the key panels with the phases shaded.
#
# The lag exporter runs as its own process so it outlives the kill: `stocksvr lag-exporter`
# when the binary has that subcommand, else the crate's example (`--example serve`).
# Ends with the query check's "N passed, N failed"; exits 1 when a query failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

render=0
[ "${1:-}" = "--render" ] && render=1
healthy_s="${HEALTHY_SECONDS:-120}"
outage_s="${OUTAGE_SECONDS:-90}"
recovery_s="${RECOVERY_SECONDS:-60}"
say() { printf '\n== live: %s\n' "$*" >&2; }

export STACK_DIR="${STACK_DIR:-$repo/.stack}"
scripts/stack status >/dev/null || { echo "live: the stack is not running; scripts/stack up" >&2; exit 1; }
eval "$(scripts/stack env)"
PY="$("$here/venv.sh")"

target="${CARGO_TARGET_DIR:-$HOME/.cache/stocksvr/target}"
bin="${STOCKSVR_BIN:-$target/debug/stocksvr}"
[ -x "$bin" ] || { say "building stocksvr"; cargo build -p stocksvr --locked; }
if "$bin" lag-exporter --help >/dev/null 2>&1; then
    exporter_kind=subcommand
else
    exporter_kind=example
    example="$target/debug/examples/serve"
    [ -x "$example" ] || { say "building the lag exporter example"; cargo build -p stocksvr-lag-exporter --example serve --locked; }
fi

work="${OBS_LIVE_DIR:-$(mktemp -d /tmp/stocksvr-obs-live.XXXXXX)}"
mkdir -p "$work"
read -r svc_port exp_port prom_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
run_id="obs_live_$$_$(date +%s)"
prefix="$run_id"
merchant=$(( 700000 + $$ % 100000 )) dish=$(( 800000 + $(date +%s) % 100000 ))
db_url="${STOCKSVR__MYSQL__URL%/*}/$run_id"
say "run $run_id: stocksvr :$svc_port, exporter :$exp_port ($exporter_kind), prometheus :$prom_port, files in $work"

pids=()
all_pid=
cleanup() {
    for pid in $all_pid "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in $all_pid "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -z "${KEEP_DB:-}" ]; then
        mysql -h127.0.0.1 -P3307 -ustocksvr -p"${STACK_DB_PASSWORD:-stocksvr}" \
            -e "DROP DATABASE IF EXISTS \`$run_id\`" 2>/dev/null || true
    fi
}
trap cleanup EXIT

wait_http() { # url seconds what
    local deadline=$(( $(date +%s) + $2 ))
    until curl -fsS -o /dev/null "$1" 2>/dev/null; do
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
wait_http "$prom/-/ready" 60 prometheus

# --- database, consumer groups at the end of the shared topics -----------------------------
mysql -h127.0.0.1 -P3307 -ustocksvr -p"${STACK_DB_PASSWORD:-stocksvr}" \
    -e "CREATE DATABASE \`$run_id\` CHARACTER SET utf8mb4"
export STOCKSVR__MYSQL__URL="$db_url"
export STOCKSVR__KAFKA__GROUP_PREFIX="$prefix"
export STOCKSVR__HTTP__LISTEN="127.0.0.1:$svc_port"
# A killed member leaves the group after 6 s instead of 45 s.
export STOCKSVR__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS=6000
export STOCKSVR__KAFKA__PROPERTIES__HEARTBEAT_INTERVAL_MS=1000
"$bin" migrate >/dev/null
# A fresh deployment starts where the shared topics end, not with other runs' records.
for pair in order-lifecycle:order.lifecycle.v1 projector:inventory.stock-change.v1 \
    schedule:inventory.schedule.v1 dead-letter:order.lifecycle.v1.dlt \
    dead-letter:inventory.schedule.v1.dlt dead-letter:inventory.stock-change.v1.dlt; do
    "$bin" offsets reset --group "$prefix.${pair%%:*}" --topic "${pair#*:}" --to-latest --execute >/dev/null
done

# --- stocksvr and the exporter ----------------------------------------------------------------
start_all() {
    "$bin" all >>"$work/all.log" 2>&1 &
    all_pid=$!
    wait_http "http://127.0.0.1:$svc_port/readyz" 120 "stocksvr all"
}
if [ "$exporter_kind" = subcommand ]; then
    STOCKSVR__HTTP__LISTEN="127.0.0.1:$exp_port" "$bin" lag-exporter >"$work/exporter.log" 2>&1 &
else
    "$example" "127.0.0.1:$exp_port" "$prefix." 2 >"$work/exporter.log" 2>&1 &
fi
pids+=($!)
start_all
api="http://127.0.0.1:$svc_port"
"$bin" bucket init --merchant-id "$merchant" --dish-id "$dish" --total 1000000 >/dev/null 2>&1

event() { # kind order_id json-data
    printf '{"event_id":"%s-%s-%s","event_type":"%s","schema_version":1,"occurred_at":"%s","producer":"obs-live","trace_id":null,"partition_key":"%s","data":%s}' \
        "$run_id" "$1" "$2" "$1" "$(date -u +%Y-%m-%dT%H:%M:%S.000+00:00)" "$2" "$3" \
        | "$bin" produce --event "$1" - >/dev/null
}
held=() confirmed=()
base=$(( $(date +%s) * 1000 ))
n=0
try_one() { # order -> prints the reservation id, or nothing when the Try failed
    local order=$1
    local reply
    reply=$(curl -sS -X POST "$api/v1/reservations" -H 'content-type: application/json' \
        -d "{\"order_id\":$order,\"order_item_id\":$((order * 10 + 1)),\"merchant_id\":$merchant,\"dish_id\":$dish,\"quantity\":1,\"order_type\":\"INSTANT\"}") || return 0
    local rid
    rid=$(printf '%s' "$reply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["reservation"]["reservation_id"])' 2>/dev/null) || return 0
    echo "$rid"
}
healthy() { # seconds
    local until=$(( $(date +%s) + $1 )) order rid
    while [ "$(date +%s)" -lt "$until" ]; do
        n=$((n + 1))
        order=$((base + n))
        rid="$(try_one "$order")"
        if [ -n "$rid" ]; then
            if [ $((n % 3)) -eq 0 ]; then
                held+=("$order:$rid")   # its OrderCreated arrives during the outage
            elif [ $((n % 5)) -eq 0 ]; then
                event OrderCreatedFailed "$order" "{\"order_id\":$order,\"merchant_id\":$merchant,\"inventory_reservation_ids\":[$rid],\"reason\":\"payment failed\"}"
            else
                event OrderCreated "$order" "{\"order_id\":$order,\"merchant_id\":$merchant,\"order_type\":\"INSTANT\",\"processing_time\":null,\"inventory_reservation_ids\":[$rid]}"
                confirmed+=("$order:$rid")
            fi
        fi
        sleep 0.2
    done
}

t0=$(date +%s)
say "healthy traffic for $healthy_s s"
healthy "$healthy_s"
t1=$(date +%s)
say "query check against $prom (${#held[@]} held back, ${#confirmed[@]} confirmed so far)"
set +e
"$PY" "$here/check_queries.py" --prometheus "$prom" --wait 30 --report "$work/queries.json" | tee "$work/queries.txt"
check_rc=${PIPESTATUS[0]}
set -e

if [ "$render" -eq 1 ]; then
    say "outage: SIGKILL stocksvr all; order events keep arriving for $outage_s s"
    kill -KILL "$all_pid"; wait "$all_pid" 2>/dev/null || true; all_pid=
    t2=$(date +%s)
    until=$(( t2 + outage_s )) i=0 sent=0
    while [ "$(date +%s)" -lt "$until" ]; do
        [ "$i" -lt $(( ${#held[@]} + ${#confirmed[@]} )) ] && sent=$((sent + 1))
        if [ "$i" -lt "${#held[@]}" ]; then
            entry="${held[$i]}"; order="${entry%%:*}"; rid="${entry#*:}"
            event OrderCreated "$order" "{\"order_id\":$order,\"merchant_id\":$merchant,\"order_type\":\"INSTANT\",\"processing_time\":null,\"inventory_reservation_ids\":[$rid]}"
        elif [ $((i - ${#held[@]})) -lt "${#confirmed[@]}" ]; then
            entry="${confirmed[$((i - ${#held[@]}))]}"; order="${entry%%:*}"; rid="${entry#*:}"
            event OrderCanceled "$order" "{\"order_id\":$order,\"merchant_id\":$merchant,\"inventory_reservation_ids\":[$rid],\"reason\":\"customer canceled\"}"
        fi
        i=$((i + 1))
        sleep 0.5
    done
    t3=$(date +%s)
    say "recovery: stocksvr all restarts and drains the $sent order events sent meanwhile; healthy traffic for $recovery_s s"
    start_all
    healthy "$recovery_s"
    t4=$(date +%s)
    echo "t0=$t0 t2=$t2 t3=$t3 t4=$t4" >"$work/phases.txt"
    "$PY" "$here/render_panels.py" --prometheus "$prom" --start "$t0" --end "$t4" --step 2 \
        --phase "$t0:$t2:healthy" --phase "$t2:$t3:stocksvr all killed" \
        --phase "$t3:$t4:restarted" \
        --title "stocksvr key panels: healthy, stocksvr all killed (lag exporter alone), restarted"
    # Which alerts the run's Prometheus fired, for the record.
    curl -fsS "$prom/api/v1/alerts" >"$work/alerts.json" || true
fi
say "files: $work (queries.txt, queries.json, all.log, exporter.log, prometheus.log)"
exit "$check_rc"
