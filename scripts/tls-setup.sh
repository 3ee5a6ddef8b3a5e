#!/usr/bin/env bash
# Makes the local stores speak TLS for the store-TLS tests (tests/support/store_tls.rs):
#
#   /var/lib/fencegate-test-tls   a throw-away test PKI, made with the openssl CLI:
#     ca.pem, ca.key              the test CA
#     server.pem, server.key      localhost only (so 127.0.0.1 is a name mismatch), signed by the test CA
#     client.pem, client.key      a client certificate signed by the test CA (mTLS)
#     other-ca.pem, other-ca.key  a second, unrelated CA (wrong-CA tests)
#     other-client.pem, .key      a client certificate signed by the unrelated CA
#   PostgreSQL 127.0.0.1:5432     ssl on with the test CA's server certificate (ALTER SYSTEM and a
#                                 reload; plain connections keep working)
#   Redis 127.0.0.1:6380          TLS only, client certificates optional
#   Redis 127.0.0.1:6381          TLS only, a client certificate from the test CA required
#
# Run by scripts/ensure-services.sh after PostgreSQL and Redis are up. Idempotent and quick when
# everything is in place: the certificates are made again only when one is missing, does not match
# its key or CA, or expires within a day; PostgreSQL is reloaded only when its settings or its copy
# of the files changed; a TLS Redis is (re)started only when it does not answer PONG over TLS.
# Prints one line per step; exits non-zero when a step failed.
set -u -o pipefail

DIR=${FENCEGATE_TEST_TLS_DIR:-/var/lib/fencegate-test-tls}
PG_DIR="$DIR/postgres"
REDIS_TLS_PORT=6380
REDIS_MTLS_PORT=6381
PG_PORT=5432
CA_DAYS=3650
LEAF_DAYS=825

failed=0
fail() { echo "$1"; failed=1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ "$(id -u)" -ne 0 ]; then
  echo "tls: needs root (writes $DIR, gives PostgreSQL its copy of the key, runs ALTER SYSTEM)"
  exit 1
fi
if ! command -v openssl >/dev/null 2>&1; then
  echo "tls: openssl not installed"
  exit 1
fi

if ! { mkdir -p "$DIR" && chmod 0755 "$DIR"; }; then
  echo "tls: cannot create $DIR"
  exit 1
fi
# One run at a time (two test runs starting together). Daemons started below get 9>&-, or they
# would hold the lock for as long as they run.
exec 9>"$DIR/.lock"
flock -w 120 9 || { echo "tls: another tls-setup.sh holds $DIR/.lock"; exit 1; }

# --- 1. certificates -------------------------------------------------------------------------

key_matches() { # cert key
  [ "$(openssl x509 -in "$1" -noout -pubkey 2>/dev/null)" = "$(openssl pkey -in "$2" -pubout 2>/dev/null)" ]
}

certs_ok() {
  local f
  for f in ca.pem ca.key server.pem server.key client.pem client.key other-ca.pem other-ca.key \
    other-client.pem other-client.key; do
    [ -s "$DIR/$f" ] || return 1
  done
  for f in ca server client other-ca other-client; do
    openssl x509 -in "$DIR/$f.pem" -noout -checkend 86400 >/dev/null 2>&1 || return 1
  done
  # The server certificate names localhost only: reached as 127.0.0.1, verify-full must refuse it
  # (tests/stores/tls.rs). An older one that also named the addresses is made again.
  if openssl x509 -in "$DIR/server.pem" -noout -ext subjectAltName 2>/dev/null | grep -q "IP Address"; then
    return 1
  fi
  openssl verify -CAfile "$DIR/ca.pem" "$DIR/server.pem" "$DIR/client.pem" >/dev/null 2>&1 || return 1
  openssl verify -CAfile "$DIR/other-ca.pem" "$DIR/other-client.pem" >/dev/null 2>&1 || return 1
  key_matches "$DIR/server.pem" "$DIR/server.key" && key_matches "$DIR/client.pem" "$DIR/client.key"
}

make_certs() {
  local tmp f
  tmp=$(mktemp -d "$DIR/.new.XXXXXX") || return 1
  # No set -e here: make_certs runs in a condition, where bash ignores it. Every step is chained.
  (
    cd "$tmp" && cat >ext.cnf <<'EOF'
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    ca() { # name subject
      openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$1.key" -out "$1.pem" -days "$CA_DAYS" -subj "$2" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    }
    leaf() { # name subject ca extensions
      local serial
      serial=$(openssl rand -hex 16) \
        && openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
          -keyout "$1.key" -out "$1.csr" -subj "$2" \
        && openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -set_serial "0x$serial" \
          -days "$LEAF_DAYS" -extfile ext.cnf -extensions "$4" -out "$1.pem"
    }
    ca ca "/O=fencegate tests/CN=fencegate test CA" \
      && ca other-ca "/O=fencegate tests/CN=fencegate unrelated test CA" \
      && leaf server "/O=fencegate tests/CN=localhost" ca server \
      && leaf client "/O=fencegate tests/CN=fencegate-test-client" ca client \
      && leaf other-client "/O=fencegate tests/CN=fencegate-other-client" other-ca client \
      && chmod 0644 ./*.pem \
      && chmod 0600 ca.key other-ca.key client.key other-client.key server.key \
      || exit 1
    # Root reads every key; the postgres user may read the server key too (PostgreSQL itself
    # uses its own copy under postgres/).
    if chown root:postgres server.key 2>/dev/null; then chmod 0640 server.key || exit 1; fi
  ) >"$tmp/openssl.log" 2>&1 || {
    cat "$tmp/openssl.log" >&2
    rm -rf "$tmp"
    return 1
  }
  for f in ca other-ca server client other-client; do
    if ! { mv -f "$tmp/$f.key" "$DIR/$f.key" && mv -f "$tmp/$f.pem" "$DIR/$f.pem"; }; then
      rm -rf "$tmp"
      return 1
    fi
  done
  rm -rf "$tmp"
}

if certs_ok; then
  echo "tls certs: ok in $DIR"
elif make_certs && certs_ok; then
  echo "tls certs: made in $DIR"
else
  echo "tls certs: could not be made in $DIR"
  exit 1
fi

# --- 2. PostgreSQL ---------------------------------------------------------------------------

PSQL=(psql -X -q -At -v ON_ERROR_STOP=1 "host=127.0.0.1 port=$PG_PORT user=postgres dbname=test sslmode=disable")

# PostgreSQL's own copy, owned by postgres (it refuses a key others can read). Written even while
# PostgreSQL is down: a cluster with ssl on does not start without these files.
pg_files_changed=0
install_pg_copy() {
  local f mode
  install -d -o postgres -g postgres -m 0755 "$PG_DIR" || return 1
  for f in server.pem server.key ca.pem; do
    mode=0644
    [ "$f" = server.key ] && mode=0600
    if ! cmp -s "$DIR/$f" "$PG_DIR/$f" || [ "$(stat -c '%U %a' "$PG_DIR/$f")" != "postgres ${mode#0}" ]; then
      install -o postgres -g postgres -m "$mode" "$DIR/$f" "$PG_DIR/$f.tmp" \
        && mv -f "$PG_DIR/$f.tmp" "$PG_DIR/$f" || return 1
      pg_files_changed=1
    fi
  done
}

pg_tls_ok() { # host: a verify-full connection to PostgreSQL with the test CA uses TLS
  [ "$(psql -X -At "host=$1 port=$PG_PORT user=postgres dbname=test sslmode=verify-full sslrootcert=$DIR/ca.pem connect_timeout=5" \
    -c 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>/dev/null)" = t ]
}

pg_step() {
  if ! install_pg_copy; then
    fail "postgres tls: could not write PostgreSQL's copy of the certificate in $PG_DIR"
    return
  fi
  if ! port_open "$PG_PORT" && [ "$pg_files_changed" = 1 ] && command -v pg_ctlcluster >/dev/null 2>&1; then
    # Its certificate files may have been what kept it from starting.
    echo "postgres tls: postgres is down and its certificate files were restored; starting it"
    for version in /etc/postgresql/*/; do
      version=${version%/}
      pg_ctlcluster --skip-systemctl-redirect "${version##*/}" main start 9>&- || true
    done
    for _ in $(seq 1 50); do port_open "$PG_PORT" && break; sleep 0.2; done
  fi
  if ! port_open "$PG_PORT"; then
    fail "postgres tls: postgres is not up on 127.0.0.1:$PG_PORT"
    return
  fi
  local want current changed=0 name value
  want="ssl=on
ssl_cert_file=$PG_DIR/server.pem
ssl_key_file=$PG_DIR/server.key
ssl_ca_file=$PG_DIR/ca.pem"
  current=$("${PSQL[@]}" -c "select name || '=' || setting from pg_settings
      where name in ('ssl', 'ssl_cert_file', 'ssl_key_file', 'ssl_ca_file') order by name") || {
    fail "postgres tls: cannot read the settings (psql as postgres on 127.0.0.1:$PG_PORT)"
    return
  }
  while IFS='=' read -r name value; do
    if ! grep -qxF "$name=$value" <<<"$current"; then
      # One statement per -c: ALTER SYSTEM cannot run inside a transaction block.
      "${PSQL[@]}" -c "alter system set $name = '$value'" >/dev/null || {
        fail "postgres tls: ALTER SYSTEM SET $name failed"
        return
      }
      changed=1
    fi
  done <<<"$want"
  if [ "$changed" = 1 ] || [ "$pg_files_changed" = 1 ] || ! pg_tls_ok localhost; then
    "${PSQL[@]}" -c 'select pg_reload_conf()' >/dev/null || {
      fail "postgres tls: pg_reload_conf() failed"
      return
    }
    # The postmaster reloads asynchronously.
    for _ in $(seq 1 25); do pg_tls_ok localhost && break; sleep 0.2; done
  fi
  if ! pg_tls_ok localhost; then
    fail "postgres tls: verify-full with $DIR/ca.pem fails (see the server log under /var/log/postgresql)"
  elif [ "$("${PSQL[@]}" -c 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>/dev/null)" != f ]; then
    fail "postgres tls: on, but plain connections (sslmode=disable) fail"
  else
    echo "postgres tls: on"
  fi
}
pg_step

# --- 3. Redis --------------------------------------------------------------------------------

redis_pong() { # port [client cert args...]
  local port=$1
  shift
  [ "$(timeout 5 redis-cli --tls --cacert "$DIR/ca.pem" "$@" -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]
}

redis_step() { # port auth-clients label
  local port=$1 auth=$2 label=$3 pidfile="/run/fencegate-redis-tls-$1.pid" pid
  local log="/var/log/redis/fencegate-tls-$1.log" dir="$DIR/redis-$1"
  local cert=()
  [ "$auth" = yes ] && cert=(--cert "$DIR/client.pem" --key "$DIR/client.key")
  if redis_pong "$port" "${cert[@]}"; then
    echo "$label: up on $port"
    return 0
  fi
  # An instance of ours that does not answer (certificates made again since it started, say).
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      # Gone, or a zombie nobody has reaped yet.
      for _ in $(seq 1 50); do
        [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" = Z ] || [ ! -e "/proc/$pid" ] && break
        sleep 0.1
      done
    fi
    rm -f "$pidfile"
  fi
  if port_open "$port"; then
    fail "$label: 127.0.0.1:$port is taken by something that does not answer PONG over TLS with $DIR/ca.pem"
    return 1
  fi
  mkdir -p "$dir" /var/log/redis
  # -::1: also on IPv6 loopback where there is one.
  if ! redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 0 --tls-port "$port" \
    --tls-cert-file "$DIR/server.pem" --tls-key-file "$DIR/server.key" \
    --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients "$auth" \
    --save "" --appendonly no --dir "$dir" --pidfile "$pidfile" --logfile "$log" 9>&-; then
    fail "$label: redis-server would not start on $port (built without TLS? see redis-server --version, $log)"
    return 1
  fi
  for _ in $(seq 1 50); do port_open "$port" && break; sleep 0.1; done
  if redis_pong "$port" "${cert[@]}"; then
    echo "$label: up on $port"
  else
    fail "$label: did not come up on $port (see $log)"
    return 1
  fi
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  fail "redis tls: redis-server/redis-cli not installed"
else
  redis_step "$REDIS_TLS_PORT" optional "redis tls"
  # The mTLS instance must turn away a client without a certificate.
  if redis_step "$REDIS_MTLS_PORT" yes "redis mtls" && redis_pong "$REDIS_MTLS_PORT"; then
    fail "redis mtls: $REDIS_MTLS_PORT answers a client without a certificate"
  fi
fi

exit "$failed"
