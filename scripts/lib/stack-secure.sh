# shellcheck shell=bash disable=SC2153  # DATA, HOST, PORT, ... are scripts/stack's
# scripts/lib/stack-secure.sh - the secure mode of scripts/stack (`up --secure`, STACK_SECURE=1).
# Sourced by scripts/stack, whose variables and helpers it uses (DATA, RUN, PORT, HOST, say, die,
# kafka_java, server_pid, ...). Every server runs behind TLS with a throwaway CA and per-role
# credentials; the plain stack is untouched when the mode is off.
#
# Files, all under $DATA so that `reset` removes them with the data they belong to:
#   secure     the flag: this data belongs to a secure stack (later calls need not repeat it)
#   tls/       ca.crt, <server>.crt/.key, client-<user>.crt/.key/.p12, keystore.password,
#              stocksvr-http.crt/.key (for stocksvr's own HTTPS listener: the demo, chaos, bench)
#              P-256 keys (unencrypted PKCS#8), v3 certificates, SAN DNS:localhost,IP:127.0.0.1
#              on server certificates; valid STACK_TLS_DAYS (3) days, made again by `up` when
#              missing or when a third of that is left (running servers are restarted)
#   secrets/   <server>-<user>.password (random per stack, kept across certificate renewals)
#              and kafka-<user>.properties for Kafka's Java tools; files mode 600
#
# Users:  kafka     admin (super user), stocksvr, stocksvr-admin, stocksvr-lag, order-service
#                   (SCRAM-SHA-512, created when the storage is formatted); User:kafka is the
#                   brokers' own certificate on the SSL listeners (also a super user)
#         registry  stocksvr (sr-developer), admin (sr-admin), order-service (sr-readonly); the
#                   first and last also as bearer tokens (secrets/registry-<user>.token)
#         mariadb   stocksvr (REQUIRE SSL, DML), stocksvr_x509 (REQUIRE X509, DML),
#                   stocksvr_admin (REQUIRE SSL, everything: migrations, test databases)
#         redis     stocksvr (the service's commands on inv:* keys), admin, replication

SECURE_FLAG="$DATA/secure"
TLS_DIR="$DATA/tls"
SECRETS="$DATA/secrets"
SECURE_TLS_DAYS="${STACK_TLS_DAYS:-3}"
SECURE=0
# The host name Kafka clients bootstrap from and brokers advertise. librdkafka checks a broker's
# certificate against the advertised host with SSL_set1_host: OpenSSL 3 matches an IP literal
# there against the IP SAN (seen with 3.0.19), OpenSSL 1.1 (and `openssl verify -verify_hostname`)
# only against DNS SANs. localhost, with its DNS SAN, passes every client's check.
KAFKA_CLIENT_HOST="$HOST"
SECURE_KAFKA_USERS="admin stocksvr stocksvr-admin stocksvr-lag order-service"
SECURE_SERVERS="kafka registry mariadb redis"
# Server certificates made beside the servers': stocksvr's own HTTPS listener (`http.tls`).
SECURE_LISTENERS="stocksvr-http"

# secure_resolve STRICT: SECURE from --secure/STACK_SECURE or, unset, from the flag stored with
# the data. STRICT (up, status, env, acls): a plain stack's data cannot turn secure, nor back.
secure_resolve() {
  local strict=$1 stored=0
  [[ -s $SECURE_FLAG ]] && stored=1
  case "${STACK_SECURE:-}" in
    "") SECURE=$stored ;;
    0 | 1) SECURE=$STACK_SECURE ;;
    *) die "STACK_SECURE=$STACK_SECURE: expected 0 or 1" ;;
  esac
  if (( SECURE != stored )); then
    if (( ! strict )); then
      SECURE=$stored
    elif (( stored )); then
      die "the data in $DATA belongs to a secure stack; leave STACK_SECURE unset (or use another STACK_DIR, or reset)"
    elif [[ -e $DATA/kafka/meta.properties || -d $DATA/mariadb/mysql || -d $DATA/redis || -d $DATA/apicurio ]]; then
      die "the data in $DATA belongs to a plain stack; a secure stack needs its own STACK_DIR (or reset)"
    fi
  fi
  (( SECURE )) || return 0
  KAFKA_CLIENT_HOST=localhost
  [[ $SECURE_TLS_DAYS =~ ^[1-9][0-9]*$ ]] || die "STACK_TLS_DAYS=$SECURE_TLS_DAYS: expected a number of days"
  # renewed by `up` once less than a third of the validity is left (a day of the default 3)
  SECURE_RENEW_SECONDS=$(( SECURE_TLS_DAYS * 86400 / 3 ))
}

secure_pw_file() { echo "$SECRETS/$1.password"; }

# Random passwords (hex: safe in SCRAM strings, URLs, properties and SQL), made once per stack.
secure_passwords() {
  local name f kafka_new=""
  for name in kafka-admin kafka-stocksvr kafka-stocksvr-admin kafka-stocksvr-lag kafka-order-service \
              registry-stocksvr registry-admin registry-order-service \
              mariadb-stocksvr mariadb-stocksvr_x509 mariadb-stocksvr_admin \
              redis-stocksvr redis-admin redis-replication keystore; do
    f="$(secure_pw_file "$name")"
    [[ -s $f ]] && continue
    (umask 077 && openssl rand -hex 24 >"$f")
    [[ $name == kafka-* ]] && kafka_new+=" ${name#kafka-}"
  done
  # SCRAM users are written when the storage is formatted, with the passwords of that day.
  if [[ -n $kafka_new && ( -e $DATA/kafka/meta.properties || -s $KAFKA_BROKERS_FILE ) ]]; then
    die "the Kafka data in $DATA was formatted with other passwords of:$kafka_new (secrets/ was removed); reset the stack"
  fi
}

# ---- certificates -------------------------------------------------------------------------

secure_certs_fresh() {
  local f
  for f in ca.crt ca.key $SECURE_SERVERS $SECURE_LISTENERS; do
    [[ $f == *.* ]] || f="$f.crt"
    [[ -s $TLS_DIR/$f ]] || return 1
  done
  for f in $SECURE_KAFKA_USERS; do [[ -s $TLS_DIR/client-$f.p12 ]] || return 1; done
  [[ -s $TLS_DIR/registry-jwt.pub && -s $SECRETS/registry-stocksvr.token ]] || return 1
  openssl x509 -checkend "$SECURE_RENEW_SECONDS" -noout -in "$TLS_DIR/ca.crt" >/dev/null 2>&1
}

# secure_leaf DIR NAME CN server|client: a P-256 key and a v3 certificate signed by DIR/ca.
# Without -extfile OpenSSL 3 writes a version 1 certificate, which rustls refuses.
secure_leaf() {
  local dir=$1 name=$2 cn=$3 kind=$4
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "subjectKeyIdentifier=hash"
    echo "authorityKeyIdentifier=keyid"
    if [[ $kind == server ]]; then
      # serverAuth and clientAuth: brokers and Redis cluster nodes also connect to each other.
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=DNS:localhost,IP:127.0.0.1"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$dir/$name.ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$dir/$name.key" \
    -out "$dir/$name.csr" -subj "/CN=$cn" 2>/dev/null || die "tls: making the key of $name failed"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -set_serial "0x$(openssl rand -hex 15)" -days "$SECURE_TLS_DAYS" -extfile "$dir/$name.ext" \
    -out "$dir/$name.crt" 2>/dev/null || die "tls: signing the certificate of $name failed"
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}

# A fresh CA and every certificate, swapped in as a whole.
secure_make_certs() {
  local d="$TLS_DIR.new" name start
  start=$(now_ms)
  rm -rf "$d" && mkdir -m 700 "$d"
  (
    umask 077
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$d/ca.key" \
      -out "$d/ca.crt" -days "$SECURE_TLS_DAYS" -subj "/CN=stocksvr stack CA $(date -u +%Y%m%dT%H%M%S)" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      2>/dev/null || die "tls: making the CA failed"
    for name in $SECURE_SERVERS $SECURE_LISTENERS; do secure_leaf "$d" "$name" "$name" server; done
    for name in $SECURE_KAFKA_USERS; do secure_leaf "$d" "client-$name" "$name" client; done
    # Java keystores (PKCS#12, which Java 17 reads as OpenSSL 3 writes it): the brokers' and one
    # per Kafka user for the Java tools, whose SASL_SSL listener wants a client certificate.
    # The registry's bearer tokens are JWTs signed with this key (RS256; Quarkus OIDC checks them
    # against the public key alone, without an OIDC server).
    if ! openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$d/registry-jwt.key" 2>/dev/null ||
       ! openssl pkey -in "$d/registry-jwt.key" -pubout -out "$d/registry-jwt.pub" 2>/dev/null; then
      die "tls: making the registry's token key failed"
    fi
    for name in kafka $SECURE_KAFKA_USERS; do
      [[ $name == kafka ]] || name="client-$name"
      openssl pkcs12 -export -in "$d/$name.crt" -inkey "$d/$name.key" -certfile "$d/ca.crt" \
        -name "$name" -out "$d/$name.p12" -passout "file:$(secure_pw_file keystore)" ||
        die "tls: writing $name.p12 failed"
    done
  )
  rm -rf "$TLS_DIR.old"
  [[ ! -d $TLS_DIR ]] || mv "$TLS_DIR" "$TLS_DIR.old"
  mv "$d" "$TLS_DIR" && rm -rf "$TLS_DIR.old"
  say "tls: new CA and certificates in ${TLS_DIR#"$STACK_DIR/"}, valid $SECURE_TLS_DAYS days ($(elapsed "$start"))"
}

# ---- up ------------------------------------------------------------------------------------

# Before `up` starts anything: flag, passwords, certificates (renewed ones restart the servers
# still holding the old), Kafka client properties.
secure_prepare() {
  (( SECURE )) || return 0
  command -v openssl >/dev/null || apt_install openssl
  mkdir -p "$TLS_DIR" "$SECRETS" && chmod 700 "$TLS_DIR" "$SECRETS"
  echo 1 >"$SECURE_FLAG"
  secure_passwords
  if ! secure_certs_fresh; then
    local name running=()
    for name in registry $KAFKA_NODES redis mariadb "${REDIS_CLUSTER_PORTS[@]/#/redis-}"; do
      server_pid "$name" >/dev/null && running+=("$name")
    done
    if (( ${#running[@]} > 0 )); then
      say "tls: certificates missing or expiring soon; restarting ${running[*]} with new ones"
      for name in "${running[@]}"; do stop_server "$name" & done
      wait
    fi
    secure_make_certs
    secure_registry_token stocksvr sr-developer
    secure_registry_token order-service sr-readonly
  fi
  local user
  for user in $SECURE_KAFKA_USERS; do secure_kafka_properties "$user"; done
}

# secure_kafka_properties USER: client settings of Kafka's Java tools for USER (SASL_SSL,
# SCRAM-SHA-512, the user's client certificate), in secrets/kafka-USER.properties.
secure_kafka_properties() {
  local user=$1 f="$SECRETS/kafka-$1.properties"
  (
    umask 077
    cat >"$f.tmp" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$user" password="$(cat "$(secure_pw_file "kafka-$user")")";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.crt
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/client-$user.p12
ssl.keystore.password=$(cat "$(secure_pw_file keystore)")
EOF
  )
  mv "$f.tmp" "$f"
}

# ---- kafka ---------------------------------------------------------------------------------

# secure_kafka_conf PORT CONTROLLER_PORT: the listener and security keys appended to a broker's
# properties (the last occurrence of a key wins). CLIENT (the stack's Kafka port) is SASL_SSL
# with SCRAM-SHA-512 and a required client certificate; INTERNAL (port+3, inter-broker) and
# CONTROLLER are SSL with mutual TLS, where the brokers are User:kafka by their certificate
# (SCRAM is not supported on controller listeners).
secure_kafka_conf() {
  local port=$1 cport=$2 jaas="org.apache.kafka.common.security.scram.ScramLoginModule required;"
  local listeners="CLIENT://$HOST:$port,INTERNAL://$HOST:$((port + 3)),CONTROLLER://$HOST:$cport"
  local advertised="CLIENT://$KAFKA_CLIENT_HOST:$port,INTERNAL://$HOST:$((port + 3))"
  local protocols="CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL" l
  if [[ $KAFKA_PROXIED == 1 ]]; then
    listeners+=",PROXIED://$HOST:$KAFKA_PROXIED_LISTENER_PORT"
    advertised+=",PROXIED://$KAFKA_CLIENT_HOST:$KAFKA_PROXY_PORT"
    protocols+=",PROXIED:SASL_SSL"
  fi
  printf '\n# ---- appended by scripts/stack: secure mode\n'
  printf 'listeners=%s\nadvertised.listeners=%s\nlistener.security.protocol.map=%s\n' \
    "$listeners" "$advertised" "$protocols"
  printf 'inter.broker.listener.name=INTERNAL\n'
  for l in client proxied; do
    printf 'listener.name.%s.sasl.enabled.mechanisms=SCRAM-SHA-512\n' "$l"
    printf 'listener.name.%s.scram-sha-512.sasl.jaas.config=%s\n' "$l" "$jaas"
    # KIP-684: on a SASL_SSL listener only the listener-prefixed key is honoured.
    printf 'listener.name.%s.ssl.client.auth=required\n' "$l"
  done
  printf 'ssl.client.auth=required\n'
  printf 'ssl.keystore.type=PKCS12\nssl.keystore.location=%s\nssl.keystore.password=%s\n' \
    "$TLS_DIR/kafka.p12" "$(cat "$(secure_pw_file keystore)")"
  printf 'ssl.truststore.type=PEM\nssl.truststore.location=%s\n' "$TLS_DIR/ca.crt"
  # "CN=kafka" -> User:kafka (the default would be User:CN=kafka)
  # shellcheck disable=SC2016  # $1 is the rule's own back-reference
  printf 'ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT\n'
  printf 'authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n'
  printf 'super.users=User:kafka;User:admin\nallow.everyone.if.no.acl.found=false\n'
}

# the --add-scram arguments of `kafka-storage format`: every Kafka user with its password
# (passed on the command line of the format run only; its process lives about a second)
secure_kafka_format_args() {
  (( SECURE )) || return 0
  local user
  for user in $SECURE_KAFKA_USERS; do
    printf -- '--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' "$user" "$(cat "$(secure_pw_file "kafka-$user")")"
  done
}

# the connection options of Kafka's tools for the admin (secure) or nothing (plain)
kafka_admin_config_args() {
  (( SECURE )) && printf -- '--command-config\n%s\n' "$SECRETS/kafka-admin.properties"
  return 0
}

# ---- registry ------------------------------------------------------------------------------

# Apicurio over HTTPS only (Quarkus TLS registry; its management port too), HTTP basic
# authentication against embedded users or a bearer token (no OIDC server), role-based
# authorization. No client certificates: quarkus.http.ssl.client-auth is fixed (NONE) when the
# registry is built.
secure_registry_conf() {
  local pw
  printf '\n# ---- appended by scripts/stack: secure mode\n'
  printf 'quarkus.http.ssl-port=%s\nquarkus.http.insecure-requests=disabled\n' "${PORT[registry]}"
  printf 'quarkus.tls.key-store.pem.0.cert=%s\nquarkus.tls.key-store.pem.0.key=%s\n' \
    "$TLS_DIR/registry.crt" "$TLS_DIR/registry.key"
  printf 'quarkus.http.auth.basic=true\n'
  # Bearer tokens: JWTs of this stack's key (secure_registry_token), checked locally.
  printf 'quarkus.oidc.tenant-enabled=true\nquarkus.oidc.application-type=service\n'
  printf 'quarkus.oidc.public-key=%s\nquarkus.oidc.token.issuer=stocksvr-stack\n' \
    "$(grep -v -- '-----' "$TLS_DIR/registry-jwt.pub" | tr -d '\n')"
  # A refused token is quoted whole by Quarkus' WARN and by the stack trace Apicurio logs with
  # its ERROR; logs/registry.log would keep it. The access log still shows every 401.
  printf 'quarkus.log.category."io.quarkus.oidc.runtime.OidcProvider".level=ERROR\n'
  printf 'quarkus.log.category."io.apicurio.registry.auth.AuthorizedInterceptor".level=OFF\n'
  printf 'quarkus.security.users.embedded.enabled=true\nquarkus.security.users.embedded.plain-text=true\n'
  for pw in stocksvr:sr-developer admin:sr-admin order-service:sr-readonly; do
    printf 'quarkus.security.users.embedded.users.%s=%s\nquarkus.security.users.embedded.roles.%s=%s\n' \
      "${pw%%:*}" "$(cat "$(secure_pw_file "registry-${pw%%:*}")")" "${pw%%:*}" "${pw#*:}"
  done
  printf 'apicurio.auth.role-based-authorization=true\n'
}

# secure_registry_token USER ROLE: secrets/registry-USER.token, a bearer token (JWT, RS256) of
# USER with ROLE, issued by stocksvr-stack and valid as long as the certificates
secure_registry_token() {
  local user=$1 role=$2 now head body sig
  now=$(date +%s)
  head=$(printf '{"alg":"RS256","typ":"JWT"}' | secure_b64url)
  body=$(printf '{"iss":"stocksvr-stack","sub":"%s","upn":"%s","groups":["%s"],"iat":%d,"exp":%d}' \
    "$user" "$user" "$role" "$now" $(( now + SECURE_TLS_DAYS * 86400 )) | secure_b64url)
  sig=$(printf '%s.%s' "$head" "$body" | openssl dgst -sha256 -sign "$TLS_DIR/registry-jwt.key" -binary | secure_b64url)
  (umask 077 && printf '%s.%s.%s' "$head" "$body" "$sig" >"$SECRETS/registry-$user.token")
}

secure_b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# curl to the registry as USER: secure_registry_curl USER CURL-ARGS... (the password goes to
# curl on its standard input, never on a command line)
secure_registry_curl() {
  local user=$1; shift
  printf 'user = "%s:%s"\n' "$user" "$(cat "$(secure_pw_file "registry-$user")")" |
    curl -K - --cacert "$TLS_DIR/ca.crt" "$@"
}

secure_registry_ready() {
  [[ "$(secure_registry_curl stocksvr -s -o /dev/null -m 5 -w '%{http_code}' \
        "https://$HOST:${PORT[registry]}/apis/ccompat/v7/subjects")" == 200 ]]
}

# ---- mariadb -------------------------------------------------------------------------------

secure_mariadb_args() {
  printf '%s\n' --ssl-cert="$TLS_DIR/mariadb.crt" --ssl-key="$TLS_DIR/mariadb.key" \
    --ssl-ca="$TLS_DIR/ca.crt" --require-secure-transport=ON
}

# The service's users get DML only (and PROCESS: the outbox relay reads INNODB_TRX); migrations,
# test databases (stocksvr_test_*, on which the service users get DML too) and anything else
# need stocksvr_admin. The unix socket (root) counts as secure transport.
secure_mariadb_sql() {
  local user host pw dml="SELECT, INSERT, UPDATE, DELETE"
  echo "CREATE DATABASE IF NOT EXISTS stocksvr CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;"
  for user in stocksvr:SSL stocksvr_x509:X509 stocksvr_admin:SSL; do
    pw="$(cat "$(secure_pw_file "mariadb-${user%%:*}")")"
    for host in 127.0.0.1 localhost; do
      echo "CREATE USER IF NOT EXISTS '${user%%:*}'@'$host' IDENTIFIED BY '$pw' REQUIRE ${user#*:};"
      echo "ALTER USER '${user%%:*}'@'$host' IDENTIFIED BY '$pw' REQUIRE ${user#*:};"
      if [[ ${user%%:*} == stocksvr_admin ]]; then
        echo "GRANT ALL PRIVILEGES ON *.* TO '${user%%:*}'@'$host' WITH GRANT OPTION;"
      else
        echo "GRANT $dml ON \`stocksvr\`.* TO '${user%%:*}'@'$host';"
        echo "GRANT $dml ON \`stocksvr\\_test\\_%\`.* TO '${user%%:*}'@'$host';"
        echo "GRANT PROCESS ON *.* TO '${user%%:*}'@'$host';"
      fi
    done
  done
  echo "FLUSH PRIVILEGES;"
}

# secure_mariadb USER [HOST] [mariadb args...]: the mariadb client over TLS, server certificate
# and host name verified, password from the user's file
secure_mariadb() {
  local user=$1 host=${2:-$HOST}; shift 2 || shift
  MYSQL_PWD="$(cat "$(secure_pw_file "mariadb-$user")")" mariadb --no-defaults --protocol=TCP \
    -h "$host" -P "${PORT[mariadb]}" -u "$user" --ssl-ca="$TLS_DIR/ca.crt" --ssl-verify-server-cert \
    --connect-timeout=3 "$@"
}

secure_mariadb_ready() { secure_mariadb stocksvr "$HOST" -N -e 'SELECT 1' >/dev/null 2>&1; }

# ---- redis ---------------------------------------------------------------------------------

# The ACL file of every Redis server: default off; admin; replication (replicas of the
# cluster); stocksvr with the commands of the store (processors/store/src: HGETALL, HMGET,
# EXISTS, ZADD, ZRANGE, ZREM, ZSCORE, TIME, WAIT, PING) and of the Lua scripts it runs with
# EVALSHA (lua/*.lua: HSET, HMGET, HINCRBY, EXISTS, EXPIRE, PEXPIRE, PERSIST, TIME, ZADD,
# ZRANGEBYSCORE, ZREM, ZSCORE), SCRIPT LOAD after NOSCRIPT, and what redis-rs sends on its own
# (SELECT for a database other than 0, CLUSTER SLOTS and READONLY in cluster mode), on inv:* only.
SECURE_REDIS_STOCKSVR_RULES='resetchannels ~inv:* -@all +ping +select +evalsha +script|load +hgetall +hmget +hset +hincrby +exists +expire +pexpire +persist +time +wait +zadd +zrange +zrangebyscore +zrem +zscore +cluster|slots +readonly'

secure_redis_acl_file() {
  local f="$RUN/redis-users.acl" user
  (
    umask 077
    {
      echo "user default off resetkeys resetchannels -@all"
      for user in admin replication stocksvr; do
        printf 'user %s on #%s ' "$user" "$(tr -d '\n' <"$(secure_pw_file "redis-$user")" | sha256sum | cut -d' ' -f1)"
        case $user in
          admin) echo '~* &* +@all' ;;
          replication) echo 'resetchannels -@all +psync +sync +replconf +ping' ;;
          stocksvr) echo "$SECURE_REDIS_STOCKSVR_RULES" ;;
        esac
      done
    } >"$f.tmp"
  )
  mv "$f.tmp" "$f"
  echo "$f"
}

# The TLS part of a Redis server's configuration (config-file syntax). Client certificates are
# checked when presented, not required: the ACL user and password identify a client.
secure_redis_tls_conf() {
  printf 'port 0\ntls-port %s\n' "$1"
  printf 'tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n' \
    "$TLS_DIR/redis.crt" "$TLS_DIR/redis.key" "$TLS_DIR/ca.crt"
  printf 'tls-auth-clients optional\ntls-replication yes\naclfile %s\n' "$(secure_redis_acl_file)"
}

# The cluster nodes' common secure settings, as a config file passed before their arguments
# (so the replicas' password never shows on a command line).
secure_redis_cluster_conf() {
  local f="$RUN/redis-cluster-secure.conf"
  (
    umask 077
    {
      secure_redis_tls_conf 0 | grep -v '^tls-port '
      printf 'tls-cluster yes\nmasteruser replication\nmasterauth %s\n' "$(cat "$(secure_pw_file redis-replication)")"
    } >"$f.tmp"
  )
  mv "$f.tmp" "$f"
  echo "$f"
}

# redis-cli as USER (default admin) over TLS; the password goes through REDISCLI_AUTH
secure_redis_cli() {
  local user=${REDIS_USER:-admin}
  REDISCLI_AUTH="$(cat "$(secure_pw_file "redis-$user")")" redis-cli --tls --cacert "$TLS_DIR/ca.crt" \
    --user "$user" "$@"
}

# ---- env -----------------------------------------------------------------------------------

# env_line NAME VALUE: an export line, the value single-quoted when the shell would split it
env_line() {
  if [[ $2 =~ ^[A-Za-z0-9_./:@,=+-]*$ ]]; then
    printf 'export %s=%s\n' "$1" "$2"
  else
    printf "export %s='%s'\n" "$1" "$2"
  fi
}

secure_env() {
  local ca="$TLS_DIR/ca.crt" brokers="" i port nodes=() user var
  for ((i = 1; i <= KAFKA_BROKERS; i++)); do brokers+="${brokers:+,}$KAFKA_CLIENT_HOST:$(kafka_cluster_port "$i")"; done
  env_line STOCKSVR__KAFKA__BROKERS "$brokers"
  env_line STOCKSVR__KAFKA__SECURITY_PROTOCOL sasl_ssl
  env_line STOCKSVR__KAFKA__TLS__CA_FILE "$ca"
  env_line STOCKSVR__KAFKA__TLS__CERT_FILE "$TLS_DIR/client-stocksvr.crt"
  env_line STOCKSVR__KAFKA__TLS__KEY_FILE "$TLS_DIR/client-stocksvr.key"
  env_line STOCKSVR__KAFKA__SASL__MECHANISM SCRAM-SHA-512
  env_line STOCKSVR__KAFKA__SASL__USERNAME stocksvr
  env_line STOCKSVR__KAFKA__SASL__PASSWORD_FILE "$(secure_pw_file kafka-stocksvr)"
  env_line STOCKSVR__REGISTRY__URL "https://$HOST:${PORT[registry]}/apis/ccompat/v7"
  env_line STOCKSVR__REGISTRY__TLS__CA_FILE "$ca"
  env_line STOCKSVR__REGISTRY__USERNAME stocksvr
  env_line STOCKSVR__REGISTRY__PASSWORD_FILE "$(secure_pw_file registry-stocksvr)"
  env_line STOCKSVR__MYSQL__URL \
    "mysql://stocksvr@$HOST:${PORT[mariadb]}/stocksvr?ssl-mode=VERIFY_IDENTITY&ssl-ca=$ca"
  env_line STOCKSVR__MYSQL__PASSWORD_FILE "$(secure_pw_file mariadb-stocksvr)"
  env_line STOCKSVR__REDIS__URL "rediss://stocksvr@$HOST:${PORT[redis]}/"
  env_line STOCKSVR__REDIS__PASSWORD_FILE "$(secure_pw_file redis-stocksvr)"
  env_line STOCKSVR__REDIS__TLS__CA_FILE "$ca"
  if redis_cluster_wanted; then
    for port in "${REDIS_CLUSTER_PORTS[@]}"; do nodes+=("rediss://stocksvr@$HOST:$port"); done
    echo "export STOCKSVR__REDIS__MODE=cluster"
    env_line STOCKSVR__REDIS__NODES "$(IFS=,; echo "${nodes[*]}")"
  fi
  (( KAFKA_BROKERS == 1 )) || echo "export STOCKSVR__KAFKA__TOPICS_ENVIRONMENT=cluster"
  env_line STACK_PROMETHEUS_URL "http://$HOST:${PORT[prometheus]}"
  [[ -z $PORT_BASE ]] || echo "export STOCKSVR__HTTP__LISTEN=$HOST:$STOCKSVR_HTTP_PORT"
  echo "# other credentials of the secure stack (tests, the demo, Kafka's own tools)"
  env_line STACK_SECURE 1
  env_line STACK_TLS_DIR "$TLS_DIR"
  # a certificate for stocksvr's own listener (STOCKSVR__HTTP__TLS__CERT_FILE/KEY_FILE), not set
  # for the service here: HTTPS and caller tokens are the caller's choice (scripts/demo --secure)
  env_line STACK_HTTP_TLS_CERT_FILE "$TLS_DIR/stocksvr-http.crt"
  env_line STACK_HTTP_TLS_KEY_FILE "$TLS_DIR/stocksvr-http.key"
  env_line STACK_KAFKA_ADMIN_PROPERTIES "$SECRETS/kafka-admin.properties"
  for user in stocksvr-admin stocksvr-lag order-service; do
    var=${user#stocksvr-}; var=${var^^}; var=${var//-/_}
    [[ $user == stocksvr-admin ]] && var=TOPICS_ADMIN
    env_line "STACK_KAFKA_${var}_USER" "$user"
    env_line "STACK_KAFKA_${var}_PASSWORD_FILE" "$(secure_pw_file "kafka-$user")"
    env_line "STACK_KAFKA_${var}_PROPERTIES" "$SECRETS/kafka-$user.properties"
    env_line "STACK_KAFKA_${var}_CERT_FILE" "$TLS_DIR/client-$user.crt"
    env_line "STACK_KAFKA_${var}_KEY_FILE" "$TLS_DIR/client-$user.key"
  done
  env_line STACK_REGISTRY_TOKEN_FILE "$SECRETS/registry-stocksvr.token"
  env_line STACK_REGISTRY_ADMIN_PASSWORD_FILE "$(secure_pw_file registry-admin)"
  env_line STACK_REGISTRY_ORDER_SERVICE_PASSWORD_FILE "$(secure_pw_file registry-order-service)"
  env_line STACK_REGISTRY_ORDER_SERVICE_TOKEN_FILE "$SECRETS/registry-order-service.token"
  env_line STACK_MYSQL_ADMIN_URL \
    "mysql://stocksvr_admin@$HOST:${PORT[mariadb]}/stocksvr?ssl-mode=VERIFY_IDENTITY&ssl-ca=$ca"
  env_line STACK_MYSQL_ADMIN_PASSWORD_FILE "$(secure_pw_file mariadb-stocksvr_admin)"
  env_line STACK_MYSQL_X509_USER stocksvr_x509
  env_line STACK_MYSQL_X509_PASSWORD_FILE "$(secure_pw_file mariadb-stocksvr_x509)"
  env_line STACK_MYSQL_X509_CERT_FILE "$TLS_DIR/client-stocksvr.crt"
  env_line STACK_MYSQL_X509_KEY_FILE "$TLS_DIR/client-stocksvr.key"
  env_line STACK_REDIS_ADMIN_PASSWORD_FILE "$(secure_pw_file redis-admin)"
}

# ---- acls ----------------------------------------------------------------------------------

# The ACLs on the cluster, one key per line: PRINCIPAL|RESOURCE_TYPE|NAME|PATTERN|OPERATION|PERMISSION
secure_acl_keys() {
  local out
  out="$(kafka_java org.apache.kafka.tools.AclCommand --bootstrap-server "$(secure_kafka_bootstrap)" \
    --command-config "$SECRETS/kafka-admin.properties" --list 2>&1)" ||
    { printf '%s\n' "$out" >&2; die "acls: listing the ACLs failed"; }
  # shellcheck disable=SC2016  # the backticks are the tool's
  printf '%s\n' "$out" | sed -n \
    -e 's/^Current ACLs for resource `ResourcePattern(resourceType=\([A-Z_]*\), name=\(.*\), patternType=\([A-Z]*\))`:.*/R \1|\2|\3/p' \
    -e 's/^[[:space:]]*(principal=\([^,]*\), host=[^,]*, operation=\([A-Z_]*\), permissionType=\([A-Z]*\))/A \1|\2|\3/p' |
    awk '$1 == "R" { sub(/^R /, ""); r = $0; next } { sub(/^A /, ""); split($0, a, "|"); print a[1] "|" r "|" a[2] "|" a[3] }'
}

secure_kafka_bootstrap() { echo "$KAFKA_CLIENT_HOST:${PORT[kafka]}"; }

# kafka-acls' operation names (Read, DescribeConfigs) as the authorizer prints them (READ, DESCRIBE_CONFIGS)
secure_acl_op() {
  local op=$1 out="" i c
  for ((i = 0; i < ${#op}; i++)); do
    c=${op:i:1}
    [[ $i -gt 0 && $c == [[:upper:]] && ${op:i-1:1} == [[:lower:]] ]] && out+=_
    out+=${c^^}
  done
  echo "$out"
}

# and back (AclCommand takes only the first form)
secure_acl_op_name() {
  local word out="" words
  IFS=_ read -r -a words <<<"${1,,}"
  for word in "${words[@]}"; do out+=${word^}; done
  echo "$out"
}

# acls apply [FILE|-]: add every ACL of FILE (stdin: - or none) that the cluster lacks. A line is
# a kafka-acls command as `stocksvr acls print` writes it:
#   kafka-acls --bootstrap-server <b> --command-config <file> --add --allow-principal User:<name>
#     --operation <Op> --<topic|group|cluster|transactional-id> [<name>] --resource-pattern-type <literal|prefixed>
# Its --bootstrap-server and --command-config are replaced by this stack's; blank lines and
# lines starting with # are skipped; anything else (--remove, --deny-principal, ...) is refused.
# Missing ACLs are added with Kafka's own AclCommand, one run per principal, resource and pattern.
secure_acls_apply() {
  local src=${1:--} line words w i principal op rtype name pattern key lines=0
  local -A want=() have=() batch=()
  [[ $src == - ]] || [[ -r $src ]] || die "acls: cannot read $src"
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    read -r -a words <<<"$line"
    [[ ${words[0]} == kafka-acls || ${words[0]} == kafka-acls.sh ]] ||
      die "acls: not a kafka-acls command: $line"
    principal="" op="" rtype="" name="" pattern=LITERAL
    local add=0
    for ((i = 1; i < ${#words[@]}; i++)); do
      w=${words[i]}
      case $w in
        --bootstrap-server | --command-config) i=$((i + 1)) ;;
        --add) add=1 ;;
        --allow-principal) i=$((i + 1)); principal=${words[i]:-} ;;
        --operation) i=$((i + 1)); op=$(secure_acl_op "${words[i]:-}") ;;
        --topic | --group | --transactional-id) rtype=${w#--}; rtype=${rtype^^}; rtype=${rtype//-/_}; i=$((i + 1)); name=${words[i]:-} ;;
        --cluster)
          rtype=CLUSTER name=kafka-cluster
          [[ ${words[i + 1]:-} == kafka-cluster ]] && i=$((i + 1)) ;;
        --resource-pattern-type) i=$((i + 1)); pattern=${words[i]:-}; pattern=${pattern^^} ;;
        *) die "acls: unsupported option '$w' in: $line" ;;
      esac
    done
    if (( ! add )) || [[ -z $principal || -z $op || -z $rtype || -z $name ]]; then
      die "acls: expected --add, --allow-principal, --operation and a resource in: $line"
    fi
    [[ $pattern == LITERAL || $pattern == PREFIXED ]] || die "acls: pattern type must be literal or prefixed: $line"
    want["$principal|$rtype|$name|$pattern|$op|ALLOW"]=1
    lines=$((lines + 1))
  done < <(if [[ $src == - ]]; then cat; else cat "$src"; fi)
  (( lines > 0 )) || die "acls: no ACL lines in ${src/#-/standard input}"
  while IFS= read -r key; do [[ -n $key ]] && have[$key]=1; done < <(secure_acl_keys)
  for key in "${!want[@]}"; do
    [[ -v "have[$key]" ]] && continue
    IFS='|' read -r principal rtype name pattern op _ <<<"$key"
    batch["$principal|$rtype|$name|$pattern"]+=" $op"
  done
  if (( ${#batch[@]} == 0 )); then
    say "acls: all ${#want[@]} ACLs of ${src/#-/standard input} are in place"
    return 0
  fi
  local args ops added=0
  for key in "${!batch[@]}"; do
    IFS='|' read -r principal rtype name pattern <<<"$key"
    args=(--bootstrap-server "$(secure_kafka_bootstrap)" --command-config "$SECRETS/kafka-admin.properties"
          --add --allow-principal "$principal" --resource-pattern-type "$pattern")
    if [[ $rtype == CLUSTER ]]; then args+=(--cluster); else rtype=${rtype,,}; args+=("--${rtype//_/-}" "$name"); fi
    read -r -a ops <<<"${batch[$key]}"
    for op in "${ops[@]}"; do args+=(--operation "$(secure_acl_op_name "$op")"); added=$((added + 1)); done
    kafka_java org.apache.kafka.tools.AclCommand "${args[@]}" >>"$LOGS/acls.log" 2>&1 ||
      { tail -n 20 "$LOGS/acls.log" >&2; die "acls: adding ${ops[*]} on $rtype $name ($pattern) for $principal failed"; }
  done
  # The controller answers an add once it has committed it, but the broker's authorizer takes
  # the ACL from the metadata log a moment later: a command run right after could still be
  # refused. The list is answered by that authorizer, so wait until it shows every ACL.
  local deadline=$((SECONDS + 60)) missing
  while :; do
    have=()
    while IFS= read -r key; do [[ -n $key ]] && have[$key]=1; done < <(secure_acl_keys)
    missing=0
    for key in "${!want[@]}"; do [[ -v "have[$key]" ]] || missing=$((missing + 1)); done
    (( missing == 0 )) && break
    (( SECONDS < deadline )) || die "acls: $missing of the added ACLs are still not in the broker's list after 60 s"
    sleep 0.5
  done
  say "acls: added $added of ${#want[@]} ACLs (the others were in place; log: ${LOGS#"$STACK_DIR/"}/acls.log)"
}

cmd_acls() {
  (( SECURE )) || die "acls: the stack is not secure (no authorizer); start it with \`up --secure\`"
  server_pid kafka >/dev/null || die "acls: kafka is not running"
  mkdir -p "$LOGS"
  case "${1:-}" in
    apply) secure_acls_apply "${2:--}" ;;
    list)
      kafka_java org.apache.kafka.tools.AclCommand --bootstrap-server "$(secure_kafka_bootstrap)" \
        --command-config "$SECRETS/kafka-admin.properties" --list ;;
    *) die "usage: scripts/stack acls apply [FILE|-] | scripts/stack acls list" ;;
  esac
}
