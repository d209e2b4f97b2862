# shellcheck shell=bash
# Sourced, not run: a load run's own database, topic namespace, consumer groups and time wheel
# on the stack that `scripts/stack env` described (STOCKSVR__MYSQL__URL, STOCKSVR__KAFKA__BROKERS
# set), so the run shares nothing with another run on the same stack. Used by
# scripts/rolling-restart and scripts/soak.
#
#   source scripts/lib/run-db.sh
#   rundb_create RUN_ID                 CREATE DATABASE, export the run's STOCKSVR__ settings
#   rundb_prepare BIN LOG               migrate, topics apply, schemas register (output to LOG)
#   rundb_drop RUN_ID PY                DROP DATABASE, delete the run's topics and groups
#
# The MariaDB password goes by environment (MYSQL_PWD), never on a command line. Needs the
# MariaDB client (`mysql`; scripts/lib/tools.sh installs it).

# The stack's MariaDB (mysql://user:password@host:port/db) as the admin client of the run.
_rundb_admin() {
    local hostport="${STOCKSVR__MYSQL__URL#*@}"
    hostport="${hostport%%/*}"
    MYSQL_PWD="${STACK_DB_PASSWORD:-stocksvr}" mysql -h"${hostport%:*}" -P"${hostport##*:}" -ustocksvr "$@"
}

rundb_create() { # run_id
    _rundb_admin -e "CREATE DATABASE \`$1\` CHARACTER SET utf8mb4"
    export STOCKSVR__MYSQL__URL="${STOCKSVR__MYSQL__URL%/*}/$1"
    export STOCKSVR__KAFKA__TOPIC_NAMESPACE="$1" STOCKSVR__KAFKA__GROUP_PREFIX="$1"
    export STOCKSVR__SCHEDULE__WHEEL_NAMESPACE="$1"
    export STOCKSVR__LOG__FILTER="info,librdkafka=warn,sqlx=warn"
}

rundb_prepare() { # bin log
    { "$1" migrate && "$1" topics apply && "$1" schemas register; } >>"$2" 2>&1
}

rundb_drop() { # run_id py
    _rundb_admin -e "DROP DATABASE IF EXISTS \`$1\`" || true
    "$2" tests/observability/workload.py cleanup --bootstrap "$STOCKSVR__KAFKA__BROKERS" \
        --namespace "$1" >/dev/null 2>&1 || true
}
