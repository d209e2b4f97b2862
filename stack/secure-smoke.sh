#!/usr/bin/env bash
# stack/secure-smoke.sh - checks a running secure stack (`scripts/stack up --secure`) with the
# servers' own clients, before any stocksvr code speaks TLS: certificates, each server's TLS and
# authentication, the Kafka ACLs of stocksvr's roles role by role (what each role may do and what
# it must be refused): those `stocksvr acls print --role all` prints for namespace demo when a
# built binary is given (--bin PATH), else stack/kafka/acls.example (the same lines, kept equal by
# a unit test), the registry's roles and bearer tokens, MariaDB's users, and the
# Redis ACL user running every real Lua script without NOPERM. One line per check; exit 1 if any
# failed. Uses the same STACK_DIR / STACK_PORT_BASE / STACK_CACHE as the stack it checks.
#
#   stack/secure-smoke.sh [--bin PATH] [SECTION...]   sections: certs kafka librdkafka registry mariadb redis
#
# Leaves behind: those ACLs and the topics demo.order.lifecycle.v1,
# demo.inventory.lifecycle.v1 and other.topic (creating them again is a no-op).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
env_out="$(scripts/stack env)"
eval "$env_out"
[[ ${STACK_SECURE:-} == 1 ]] || { echo "secure-smoke: the stack is not secure (scripts/stack up --secure)" >&2; exit 2; }
stack_dir="${STACK_DIR:-$repo/.stack}"
kafka_lib="${STACK_CACHE:-$stack_dir/cache}/kafka-4.1.1/lib"
tls=$STACK_TLS_DIR
ca=$tls/ca.crt
secrets="$(dirname "$STOCKSVR__KAFKA__SASL__PASSWORD_FILE")"
bootstrap=${STOCKSVR__KAFKA__BROKERS%%,*}
kport=${bootstrap##*:}
rport=${STOCKSVR__REDIS__URL##*:}; rport=${rport%/}
mport=${STOCKSVR__MYSQL__URL#*@*:}; mport=${mport%%/*}
registry=$STOCKSVR__REGISTRY__URL
gport=${registry#https://*:}; gport=${gport%%/*}
bin=""
if [[ ${1:-} == --bin ]]; then bin=$2; shift 2; fi
[[ -z $bin || -x $bin ]] || { echo "secure-smoke: no executable stocksvr at $bin" >&2; exit 2; }
sections=("$@")
(( ${#sections[@]} > 0 )) || sections=(certs kafka librdkafka registry mariadb redis)

passed=0 failed=0
# check NAME EXPECT CMD...: EXPECT is `ok` (exit 0 and, with ok:RE, output matching RE) or
# `deny:RE` (output matching RE, whatever the exit code: some Kafka tools exit 0 on errors)
check() {
  local name=$1 expect=$2 out rc=0; shift 2
  out="$("$@" 2>&1)" || rc=$?
  local ok=0
  case $expect in
    ok) (( rc == 0 )) && ok=1 ;;
    ok:*) (( rc == 0 )) && [[ $out =~ ${expect#ok:} ]] && ok=1 ;;
    deny:*) [[ $out =~ ${expect#deny:} ]] && ok=1 ;;
  esac
  if (( ok )); then
    passed=$((passed + 1))
    printf 'ok    %s\n' "$name"
  else
    failed=$((failed + 1))
    printf 'FAIL  %s (exit %s, expected %s)\n' "$name" "$rc" "$expect"
    printf '%s\n' "$out" | tail -n 8 | sed 's/^/      | /'
  fi
}
section() { [[ " ${sections[*]} " == *" $1 "* ]] && printf -- '-- %s\n' "$1"; }

# ---- certificates ----------------------------------------------------------------------------
cert_ok() {
  local f=$1 text
  text="$(openssl x509 -in "$f" -noout -text)"
  [[ $text == *"Version: 3 (0x2)"* && $text == *"prime256v1"* ]] &&
    openssl verify -CAfile "$ca" "$f" >/dev/null && echo "v3 P-256, chains to the stack CA"
}
server_cert_ok() {
  cert_ok "$1" && openssl x509 -in "$1" -noout -ext subjectAltName | grep -q 'DNS:localhost, IP Address:127.0.0.1'
}
pkcs8() { head -n 1 "$1" | grep -qx -- '-----BEGIN PRIVATE KEY-----'; }
s_client() {  # s_client PORT NAME_OPTION [extra...]: TLS handshake, chain and name verified
  local port=$1; shift
  openssl s_client -connect "127.0.0.1:$port" -CAfile "$ca" -verify_return_error "$@" </dev/null 2>&1 |
    grep -E '^Verify return code: 0 \(ok\)|^Verification: OK'
}
if section certs; then
  for s in kafka registry mariadb redis; do
    check "certs: $s.crt v3, P-256, SAN DNS:localhost,IP:127.0.0.1" ok server_cert_ok "$tls/$s.crt"
    check "certs: $s.key is unencrypted PKCS#8" ok pkcs8 "$tls/$s.key"
  done
  check "certs: client-stocksvr.crt v3, P-256" ok cert_ok "$tls/client-stocksvr.crt"
  check "certs: CA expires in more than a day" ok openssl x509 -checkend 86400 -noout -in "$ca"
  kcert=(-cert "$tls/client-stocksvr.crt" -key "$tls/client-stocksvr.key")
  for name in "-verify_hostname localhost" "-verify_ip 127.0.0.1"; do
    read -r -a opt <<<"$name"
    check "tls: kafka $kport ($name)" ok s_client "$kport" "${opt[@]}" "${kcert[@]}"
    check "tls: registry $gport ($name)" ok s_client "$gport" "${opt[@]}"
    check "tls: redis $rport ($name)" ok s_client "$rport" "${opt[@]}"
    check "tls: mariadb $mport ($name, STARTTLS)" ok s_client "$mport" "${opt[@]}" -starttls mysql
  done
  check "tls: a name not in the certificate is refused (-verify_hostname vm)" deny:'hostname mismatch' \
    openssl s_client -connect "127.0.0.1:$gport" -CAfile "$ca" -verify_return_error -verify_hostname vm
fi

# ---- kafka: ACLs role by role with Kafka's own tools -----------------------------------------
kj() {
  java -Xms32m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$repo/stack/kafka/tools-log4j2.properties" -cp "$kafka_lib/*" "$@"
}
props() { echo "$secrets/kafka-$1.properties"; }
topic_create() {  # topic_create USER TOPIC
  kj org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --command-config "$(props "$1")" \
    --create --if-not-exists --topic "$2" --partitions 2
}
produce() {  # produce USER TOPIC: one record from an idempotent producer, acks=all, waited for
  echo "smoke:$(date +%s%N)" | kj org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$bootstrap" \
    --producer.config "$(props "$1")" --topic "$2" --sync --property parse.key=true --property key.separator=: \
    --producer-property enable.idempotence=true --producer-property acks=all
}
consume() {  # consume USER TOPIC GROUP: one record as a member of GROUP
  kj org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$bootstrap" --consumer.config "$(props "$1")" \
    --topic "$2" --group "$3" --from-beginning --max-messages 1 --timeout-ms 20000
}
ns=demo
order=$ns.order.lifecycle.v1
inventory=$ns.inventory.lifecycle.v1
if section kafka; then
  acls="$stack_dir/run/smoke-acls"
  if [[ -n $bin ]]; then
    acls_from="stocksvr acls print --role all"
    STOCKSVR__KAFKA__TOPIC_NAMESPACE=$ns STOCKSVR__KAFKA__GROUP_PREFIX=stocksvr "$bin" acls print --role all >"$acls"
  else
    acls_from="stack/kafka/acls.example"
    cp stack/kafka/acls.example "$acls"
  fi
  check "acls: apply those of $acls_from" ok:'acls: (added|all)' scripts/stack acls apply "$acls"
  check "acls: applying again changes nothing" ok:'are in place' scripts/stack acls apply - <"$acls"
  check "admin (super user) creates other.topic" ok topic_create admin other.topic
  denied='TopicAuthorizationException|Not authorized to access topics'
  check "stocksvr cannot create topics" deny:"$denied" topic_create stocksvr "$ns.made-by-stocksvr"
  check "stocksvr-admin creates $order" ok topic_create stocksvr-admin "$order"
  check "stocksvr-admin creates $inventory" ok topic_create stocksvr-admin "$inventory"
  check "stocksvr-admin cannot create outside the namespace" deny:"$denied" topic_create stocksvr-admin other.made
  alter() {
    kj kafka.admin.ConfigCommand --bootstrap-server "$bootstrap" --command-config "$(props "$1")" \
      --alter --entity-type topics --entity-name "$2" --add-config retention.ms=604800000
  }
  check "stocksvr-admin alters $order's config" ok:'Completed updating config' alter stocksvr-admin "$order"
  check "stocksvr cannot alter topic configs" deny:'ClusterAuthorizationException|TopicAuthorizationException|Authorization failed' \
    alter stocksvr "$order"
  check "order-service produces to $order (idempotent, no IdempotentWrite ACL)" ok produce order-service "$order"
  check "order-service cannot produce to $inventory" deny:"$denied" produce order-service "$inventory"
  check "order-service cannot read $order" deny:'Not authorized|AuthorizationException' consume order-service "$order" stocksvr.order-lifecycle
  check "stocksvr consumes $order as group stocksvr.order-lifecycle" ok:'Processed a total of 1 message' \
    consume stocksvr "$order" stocksvr.order-lifecycle
  check "stocksvr cannot join a group outside its prefix" deny:'GroupAuthorizationException' consume stocksvr "$order" other.group
  check "stocksvr produces to $inventory (idempotent)" ok produce stocksvr "$inventory"
  check "stocksvr produces to $order (dead-letter replay, stocksvr produce)" ok produce stocksvr "$order"
  check "stocksvr cannot produce outside the namespace" deny:"$denied" produce stocksvr other.topic
  describe_group() {
    kj org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$bootstrap" \
      --command-config "$(props "$1")" --describe --group "$2"
  }
  check "stocksvr-lag describes group stocksvr.order-lifecycle (committed offsets, lag)" \
    ok:"stocksvr.order-lifecycle +$order" describe_group stocksvr-lag stocksvr.order-lifecycle
  check "stocksvr-lag reads watermarks (ListOffsets)" ok:"$order:0:" \
    kj org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$bootstrap" --command-config "$(props stocksvr-lag)" --topic "$order"
  # (Refused already at InitProducerId: with no Write on any topic, KIP-679's rule leaves only
  # IdempotentWrite on the cluster, which no role has.)
  check "stocksvr-lag cannot produce" deny:"$denied|ClusterAuthorizationException" produce stocksvr-lag "$order"
  check "stocksvr-lag cannot join a group" deny:'GroupAuthorizationException' consume stocksvr-lag "$order" stocksvr.lag-probe
  check "stocksvr-admin cannot read records" deny:'Not authorized|AuthorizationException' consume stocksvr-admin "$order" stocksvr.x
fi

# ---- librdkafka (the client library stocksvr uses), through the interop tests' confluent-kafka
if section librdkafka; then
  py="$(STACK_DIR=$stack_dir tests/interop/venv.sh 2>/dev/null)" || py=""
  rdk() {  # rdk LABEL USER BOOTSTRAP TOPIC [key=value...]: one idempotent produce, its outcome
    "$py" - "$@" <<'PY'
import sys
from confluent_kafka import Producer, version, libversion
label, user, bootstrap, topic, *extra = sys.argv[1:]
import os
tls, secrets = os.environ["STACK_TLS_DIR"], os.path.dirname(os.environ["STOCKSVR__KAFKA__SASL__PASSWORD_FILE"])
conf = {
    "bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": user, "sasl.password": open(f"{secrets}/kafka-{user}.password").read().strip(),
    "ssl.ca.location": f"{tls}/ca.crt", "ssl.certificate.location": f"{tls}/client-{user}.crt",
    "ssl.key.location": f"{tls}/client-{user}.key", "enable.idempotence": True, "acks": "all",
    "message.timeout.ms": 8000, "broker.address.family": "v4", "logger": None,
}
for kv in extra:
    k, v = kv.split("=", 1)
    if v:
        conf[k] = v
    else:
        conf.pop(k, None)
errors, reports = [], []
conf["error_cb"] = lambda e: errors.append(e.str())
p = Producer(conf)
p.produce(topic, key=b"k", value=b"v", on_delivery=lambda e, m: reports.append(e))
p.flush(15)
ok = bool(reports) and reports[0] is None
print(f"librdkafka {libversion()[0]}: {'delivered' if ok else reports[0] if reports else 'no report'}")
for e in sorted(set(errors))[:2]:
    print(e)
sys.exit(0 if ok else 1)
PY
  }
  rdk_reader() {  # rdk_reader USER GROUP_ID TOPIC: the lag exporter's assign()-ed reader, no errors
    "$py" - "$@" <<'PY'
import os, sys, time
from confluent_kafka import Consumer, TopicPartition
user, group, topic = sys.argv[1:]
tls, secrets = os.environ["STACK_TLS_DIR"], os.path.dirname(os.environ["STOCKSVR__KAFKA__SASL__PASSWORD_FILE"])
errors = []
c = Consumer({
    "bootstrap.servers": os.environ["STOCKSVR__KAFKA__BROKERS"], "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user,
    "sasl.password": open(f"{secrets}/kafka-{user}.password").read().strip(),
    "ssl.ca.location": f"{tls}/ca.crt", "ssl.certificate.location": f"{tls}/client-{user}.crt",
    "ssl.key.location": f"{tls}/client-{user}.key", "group.id": group, "enable.auto.commit": False,
    "enable.auto.offset.store": False, "broker.address.family": "v4", "logger": None,
    "error_cb": lambda e: errors.append(e.str()),
})
c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
records, deadline = 0, time.time() + 6
while time.time() < deadline:
    m = c.poll(0.5)
    if m is not None:
        if m.error():
            errors.append(m.error().str())
        else:
            records += 1
c.close()
print(f"records={records} errors={sorted(set(errors))}")
sys.exit(0 if records > 0 and not errors else 1)
PY
  }
  if [[ -z $py ]]; then
    printf 'skip  librdkafka: tests/interop/venv.sh failed\n'
  else
    check "librdkafka: order-service idempotent produce, SASL_SSL, no IdempotentWrite" ok:delivered \
      rdk x order-service "$bootstrap" "$order"
    check "librdkafka: bootstrap 127.0.0.1 (IP SAN; OpenSSL 3 SSL_set1_host takes IPs)" ok:delivered \
      rdk x order-service "127.0.0.1:$kport" "$order"
    check "librdkafka: a host name not in the certificate is refused (vm)" deny:'certificate verify failed|[Hh]ostname mismatch' \
      rdk x order-service "vm:$kport" "$order"
    check "librdkafka: without a client certificate the handshake fails" deny:'bad certificate|certificate required' \
      rdk x stocksvr "$bootstrap" "$inventory" ssl.certificate.location= ssl.key.location=
    check "librdkafka: a wrong password is an authentication error" deny:'SASL authentication error' \
      rdk x stocksvr "$bootstrap" "$inventory" sasl.password=wrong
    check "librdkafka: a wrong CA fails the handshake" deny:'certificate verify failed' \
      rdk x stocksvr "$bootstrap" "$inventory" ssl.ca.location=/etc/ssl/certs/ca-certificates.crt
    check "librdkafka: stocksvr-lag's assign()-ed reader (group.id stocksvr.lag-exporter-reader) reads, no group error" \
      ok:'errors=\[\]' rdk_reader stocksvr-lag stocksvr.lag-exporter-reader "$order"
    check "librdkafka: stocksvr's own lag reader (inside stocksvr all) reads the same way" \
      ok:'errors=\[\]' rdk_reader stocksvr stocksvr.lag-exporter-reader "$order"
    check "librdkafka: order-service is refused $inventory" deny:'TOPIC_AUTHORIZATION_FAILED|Topic authorization failed' \
      rdk x order-service "$bootstrap" "$inventory"
  fi
fi

# ---- registry ----------------------------------------------------------------------------------
reg() {  # reg USER CURL-ARGS...: HTTP status (and body) as USER with basic auth
  local user=$1; shift
  printf 'user = "%s:%s"\n' "$user" "$(cat "$secrets/registry-$user.password")" |
    curl -K - -s --cacert "$ca" -w ' %{http_code}' "$@"
}
bearer() {  # bearer TOKEN_FILE CURL-ARGS...
  local f=$1; shift
  printf 'header = "Authorization: Bearer %s"\n' "$(cat "$f")" | curl -K - -s --cacert "$ca" -w ' %{http_code}' "$@"
}
if section registry; then
  log="$stack_dir/logs/registry.log"
  check "registry: log shows the authentication chain basic -> oidc" ok grep -q 'Authentication chain: basic -> oidc' "$log"
  check "registry: no credentials -> 401" ok:' 401$' curl -s -o /dev/null --cacert "$ca" -w ' %{http_code}' "$registry/subjects"
  check "registry: plain http is not served" deny:'^000$|Empty reply' \
    curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$gport/apis/ccompat/v7/subjects"
  check "registry: system CAs only -> certificate refused" deny:'^000$' curl -s -o /dev/null -w '%{http_code}' "$registry/subjects"
  check "registry: stocksvr basic -> 200" ok:' 200$' reg stocksvr -o /dev/null "$registry/subjects"
  check "registry: by name localhost -> 200" ok:' 200$' reg stocksvr -o /dev/null "https://localhost:$gport/apis/ccompat/v7/subjects"
  schema='{"schema":"{\"type\":\"record\",\"name\":\"Smoke\",\"fields\":[{\"name\":\"a\",\"type\":\"int\"}]}"}'
  ct='Content-Type: application/vnd.schemaregistry.v1+json'
  check "registry: stocksvr (sr-developer) registers a schema" ok:'"id":[0-9]+\} 200$' \
    reg stocksvr -X POST -H "$ct" -d "$schema" "$registry/subjects/smoke-value/versions"
  check "registry: order-service (sr-readonly) fetches it" ok:'"subject":"smoke-value".* 200$' \
    reg order-service "$registry/subjects/smoke-value/versions/latest"
  check "registry: order-service cannot register -> 403" ok:' 403$' \
    reg order-service -X POST -H "$ct" -d "$schema" "$registry/subjects/smoke-other-value/versions"
  check "registry: stocksvr bearer token -> 200" ok:' 200$' bearer "$STACK_REGISTRY_TOKEN_FILE" -o /dev/null "$registry/subjects"
  check "registry: read-only bearer token cannot register -> 403" ok:' 403$' \
    bearer "$STACK_REGISTRY_ORDER_SERVICE_TOKEN_FILE" -o /dev/null -X POST -H "$ct" -d "$schema" "$registry/subjects/smoke-other-value/versions"
  bad="$(mktemp)"
  token="$(cat "$STACK_REGISTRY_TOKEN_FILE")"
  printf '%s' "${token/.eyJ/.eyJhZG1pbiI6dHJ1ZSwi}" >"$bad"   # a claim added, the signature kept
  check "registry: a tampered token -> 401" ok:' 401$' bearer "$bad" -o /dev/null "$registry/subjects"
  printf 'x%s' "$token" >"$bad"
  check "registry: a malformed token -> 401" ok:' 401$' bearer "$bad" -o /dev/null "$registry/subjects"
  rm -f "$bad"
  no_secret_in() {  # no_secret_in LOG: none of the registry's passwords and tokens appears in LOG
    local f
    for f in "$secrets"/registry-*.password "$secrets"/registry-*.token; do
      if grep -qF -- "$(cat "$f")" "$1"; then echo "the secret of $(basename "$f") is in $1"; return 1; fi
    done
  }
  check "registry: no password or token in its log" ok no_secret_in "$stack_dir/logs/registry.log"
  check "registry: wrong password -> 401" ok:' 401$' \
    sh -c "printf 'user = \"stocksvr:wrong\"\n' | curl -K - -s -o /dev/null --cacert '$ca' -w ' %{http_code}' '$registry/subjects'"
  check "registry: stocksvr deletes the subject" ok:' 200$' reg stocksvr -X DELETE "$registry/subjects/smoke-value"
fi

# ---- mariadb -----------------------------------------------------------------------------------
my() {  # my USER HOST [mariadb args...]: TLS, server certificate and name verified
  local user=$1 host=$2; shift 2
  MYSQL_PWD="$(cat "$secrets/mariadb-$user.password")" mariadb --no-defaults --protocol=TCP -h "$host" -P "$mport" \
    -u "$user" --connect-timeout=3 --ssl-ca="$ca" --ssl-verify-server-cert -N "$@"
}
if section mariadb; then
  check "mariadb: stocksvr over TLS 1.3 via 127.0.0.1, verified" ok:'TLSv1\.3' my stocksvr 127.0.0.1 -e "SHOW STATUS LIKE 'Ssl_version'"
  check "mariadb: stocksvr over TLS via localhost, verified" ok:'stocksvr@' my stocksvr localhost -e 'SELECT CURRENT_USER()'
  check "mariadb: a name not in the certificate is refused (vm)" deny:'Validation of SSL server certificate failed|certificate' \
    my stocksvr vm -e 'SELECT 1'
  check "mariadb: a wrong CA is refused" deny:'self-signed certificate|certificate verify failed' \
    my stocksvr 127.0.0.1 --ssl-ca=/etc/ssl/certs/ca-certificates.crt -e 'SELECT 1'
  check "mariadb: plaintext is refused" deny:'Access denied|insecure transport' \
    env MYSQL_PWD="$(cat "$secrets/mariadb-stocksvr.password")" mariadb --no-defaults --protocol=TCP -h 127.0.0.1 \
    -P "$mport" -u stocksvr --skip-ssl -e 'SELECT 1'
  check "mariadb: stocksvr_x509 without a client certificate is refused" deny:'Access denied' my stocksvr_x509 127.0.0.1 -e 'SELECT 1'
  check "mariadb: stocksvr_x509 with its client certificate" ok:'stocksvr_x509@' my stocksvr_x509 127.0.0.1 \
    --ssl-cert="$tls/client-stocksvr.crt" --ssl-key="$tls/client-stocksvr.key" -e 'SELECT CURRENT_USER()'
  check "mariadb: stocksvr cannot run DDL" deny:'CREATE command denied' my stocksvr 127.0.0.1 stocksvr -e 'CREATE TABLE smoke (a int)'
  check "mariadb: stocksvr_admin runs DDL" ok my stocksvr_admin 127.0.0.1 stocksvr -e 'CREATE TABLE IF NOT EXISTS smoke (a int)'
  check "mariadb: stocksvr runs DML" ok:'^1$' my stocksvr 127.0.0.1 stocksvr -e 'INSERT INTO smoke VALUES (1); SELECT COUNT(*) FROM smoke; DELETE FROM smoke'
  check "mariadb: stocksvr reads INNODB_TRX (PROCESS, for the outbox relay)" ok my stocksvr 127.0.0.1 -e 'SELECT COUNT(*) FROM information_schema.INNODB_TRX'
  check "mariadb: stocksvr_admin drops the table" ok my stocksvr_admin 127.0.0.1 stocksvr -e 'DROP TABLE smoke'
fi

# ---- redis: the service's ACL user against the real scripts ------------------------------------
rc() {  # rc USER redis-cli-args...
  local user=$1; shift
  REDISCLI_AUTH="$(cat "$secrets/redis-$user.password")" redis-cli --tls --cacert "$ca" -h 127.0.0.1 -p "$rport" --user "$user" "$@"
}
# sha NAME: the SHA1 Redis knows _common.lua + NAME.lua by (the text the store sends)
sha() { cat lua/_common.lua "lua/$1.lua" | sha1sum | cut -d' ' -f1; }
run() {  # run NAME NUMKEYS KEYS... ARGS...: EVALSHA as stocksvr; prints the reply, fails on an error reply
  local name=$1 out; shift
  out="$(rc stocksvr EVALSHA "$(sha "$name")" "$@" 2>&1)"
  echo "$out" | tr '\n' ' '
  [[ $out != *ERR* && $out != *NOPERM* && $out != *NOSCRIPT* ]]
}
if section redis; then
  check "redis: plaintext is refused" deny:'reset by peer|Error|closed' redis-cli -h 127.0.0.1 -p "$rport" ping
  check "redis: TLS without a user -> NOAUTH (default user off)" deny:'NOAUTH' \
    redis-cli --tls --cacert "$ca" -h 127.0.0.1 -p "$rport" ping
  check "redis: stocksvr via 127.0.0.1" ok:PONG rc stocksvr ping
  check "redis: stocksvr via localhost" ok:PONG \
    env REDISCLI_AUTH="$(cat "$secrets/redis-stocksvr.password")" redis-cli --tls --cacert "$ca" -h localhost -p "$rport" --user stocksvr ping
  check "redis: with a client certificate (optional)" ok:PONG rc stocksvr --cert "$tls/client-stocksvr.crt" --key "$tls/client-stocksvr.key" ping
  check "redis: a wrong CA is refused" deny:'certificate verify failed' rc stocksvr --cacert /etc/ssl/certs/ca-certificates.crt ping
  check "redis: a wrong password is refused" deny:'WRONGPASS' \
    env REDISCLI_AUTH=wrong redis-cli --tls --cacert "$ca" -h 127.0.0.1 -p "$rport" --user stocksvr ping
  rc admin ACL LOG RESET >/dev/null
  for s in init_bucket try confirm cancel refund adjust set_state repair restore_fences wheel_claim wheel_release; do
    cat lua/_common.lua "lua/$s.lua" >"$stack_dir/run/smoke-script.lua"
    check "redis: stocksvr loads $s.lua (SCRIPT LOAD)" ok:"^$(sha "$s")\$" \
      rc stocksvr -x SCRIPT LOAD <"$stack_dir/run/smoke-script.lua"
  done
  b="{smoke:$$:2026-01-01}" ttl=600000
  stock="inv:$b:stock"
  check "redis: init_bucket" ok:'SUCCEEDED' run init_bucket 2 "$stock" "inv:$b:op:init" init 10 1 "$ttl"
  check "redis: try (fence RESERVED, PERSIST)" ok:'SUCCEEDED' run try 3 "$stock" "inv:$b:reservation:101" "inv:$b:op:try101" 101 try101 2 "$ttl"
  check "redis: confirm" ok:'SUCCEEDED' run confirm 3 "$stock" "inv:$b:reservation:101" "inv:$b:op:confirm101" 101 confirm101 "$ttl"
  check "redis: refund (partial, PEXPIRE)" ok:'SUCCEEDED' run refund 3 "$stock" "inv:$b:reservation:101" "inv:$b:op:refund101" 101 refund101 1 "$ttl"
  check "redis: try 102" ok:'SUCCEEDED' run try 3 "$stock" "inv:$b:reservation:102" "inv:$b:op:try102" 102 try102 1 "$ttl"
  check "redis: cancel 102" ok:'SUCCEEDED' run cancel 3 "$stock" "inv:$b:reservation:102" "inv:$b:op:cancel102" 102 cancel102 1 "$ttl" ''
  check "redis: adjust" ok:'SUCCEEDED' run adjust 2 "$stock" "inv:$b:op:adj" adj 12 '' 2 "$ttl"
  check "redis: repair with a stale version (CONFLICT, recorded)" ok:'CONFLICT' \
    run repair 2 "$stock" "inv:$b:op:rep" rep REPAIR 1 12 11 0 1 0 '' 2 "$ttl"
  check "redis: restore_fences (EXISTS)" ok run restore_fences 2 "inv:$b:reservation:103" "inv:$b:op:try103" \
    "$ttl" 1 1 103 CANCELED 1 0 try103 '' cancel103 '' 103 TRY RESERVED 1
  check "redis: set_state CLOSED" ok:'SUCCEEDED' run set_state 2 "$stock" "inv:$b:op:close" close CLOSED 0 "$ttl"
  check "redis: set_state ARCHIVED (EXPIRE)" ok:'SUCCEEDED' run set_state 2 "$stock" "inv:$b:op:archive" archive ARCHIVED 60 "$ttl"
  shard="inv:{schedule:smoke$$:0}:due"
  check "redis: ZADD NX a due wheel entry (the store's arm)" ok:'^1$' rc stocksvr ZADD "$shard" NX "$(( $(date +%s) * 1000 - 1000 ))" 201
  check "redis: wheel_claim (TIME, ZRANGEBYSCORE, ZADD XX)" ok:'201' run wheel_claim 1 "$shard" 10 30000
  lease="$(rc stocksvr ZSCORE "$shard" 201)"
  check "redis: wheel_release (ZSCORE, ZREM)" ok:'^1' run wheel_release 1 "$shard" 201 "$lease"
  for c in "HGETALL $stock" "HMGET $stock total available" "EXISTS $stock" "ZRANGE $shard 0 0 WITHSCORES" \
           "ZSCORE $shard 201" "ZREM $shard 201" TIME "WAIT 0 100" PING; do
    read -r -a words <<<"$c"
    check "redis: the store's ${words[0]}" deny:'^[^EN]|^$' rc stocksvr "${words[@]}"
  done
  check "redis: ACL LOG is empty after all of the above" ok:'^$' rc admin ACL LOG
  check "redis: stocksvr cannot FLUSHALL" deny:'NOPERM' rc stocksvr FLUSHALL
  check "redis: stocksvr cannot touch keys outside inv:*" deny:'NOPERM' rc stocksvr HSET other:key a 1
  check "redis: stocksvr cannot EVAL (scripts go by EVALSHA)" deny:'NOPERM' rc stocksvr EVAL 'return 1' 0
  del="$(echo "return redis.call('DEL', KEYS[1])" | rc stocksvr -x SCRIPT LOAD)"
  check "redis: a command a script must not run is refused inside it (DEL)" deny:"can't run this command|NOPERM" \
    rc stocksvr EVALSHA "$del" 1 "$stock"
  check "redis: ACL LOG names that script's DEL" ok:'del' rc admin ACL LOG 1
  rc admin DEL "$stock" "inv:$b:reservation:101" "inv:$b:reservation:102" "inv:$b:reservation:103" "$shard" >/dev/null
  for k in init try101 confirm101 refund101 try102 cancel102 adj rep close archive try103; do rc admin DEL "inv:$b:op:$k" >/dev/null; done
fi

printf -- '-- %d passed, %d failed\n' "$passed" "$failed"
(( failed == 0 ))
