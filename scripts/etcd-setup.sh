#!/usr/bin/env bash
# Starts the local etcd servers for the etcd store tests (tests/support/etcd.rs), installing etcd
# from Debian (etcd-server, etcd-client) when it is missing:
#
#   plain  http://127.0.0.1:2379 (peer 2380)
#   tls    https://127.0.0.1:2381, advertised as https://localhost:2381 (peer http 2382); a client
#          certificate signed by the test CA (/var/lib/fencegate-test-tls) is required
#   auth   http://127.0.0.1:2383 (peer 2384) with authentication on: user root (password
#          fencegate-test-root), user fencegate (password fencegate-test) with the role fencegate,
#          which may read and write the keys under fencegate-test/ and nothing else
#
# Each is a single-member cluster with its data in /var/lib/fencegate-test-etcd/NAME and its log
# in /var/log/fencegate-test-etcd-NAME.log, started by hand in the background (the package's
# service cannot start here) and left running. History is compacted to the last 10000 revisions:
# the tests write a lot.
#
# The tls server does not use the test server certificate itself: etcd's JSON gateway (what
# fencegate speaks) reaches the gRPC server over TLS presenting the server certificate as its
# client certificate, and with client certificates required that certificate must also allow
# client authentication, which the test one does not. So it gets its own, in
# /var/lib/fencegate-test-etcd/tls-certs: localhost only like the test one, signed by the same
# test CA, for both uses. Clients see no difference.
#
# Run by scripts/ensure-services.sh after scripts/tls-setup.sh (it needs the test CA). Idempotent
# and quick when everything is in place: a server is started only when it does not answer, and
# authentication is set up only while it is still off. To start a server from scratch, stop it
# and delete its data directory. Prints one line per server; exits non-zero when one is not up.
set -u -o pipefail

DIR=${FENCEGATE_TEST_ETCD_DIR:-/var/lib/fencegate-test-etcd}
TLS_DIR=${FENCEGATE_TEST_TLS_DIR:-/var/lib/fencegate-test-tls}
CERT_DIR="$DIR/tls-certs"
LEAF_DAYS=825
ROOT_PASSWORD=fencegate-test-root
TEST_USER=fencegate
TEST_PASSWORD=fencegate-test
TEST_PREFIX=fencegate-test/

failed=0
fail() { echo "$1"; failed=1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

alive() { # pid: running (not gone, not a zombie nobody has reaped yet)
  [ -e "/proc/$1" ] && [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

if [ "$(id -u)" -ne 0 ]; then
  echo "etcd: needs root (installs etcd, writes $DIR and /var/log)"
  exit 1
fi

# --- 1. install -------------------------------------------------------------------------------

if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
  echo "etcd: installing etcd-server and etcd-client"
  if ! { apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client; }; then
    echo "etcd: could not install etcd-server and etcd-client"
    exit 1
  fi
  if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
    echo "etcd: etcd or etcdctl still missing after installing etcd-server and etcd-client"
    exit 1
  fi
fi

if ! { mkdir -p "$DIR" && chmod 0755 "$DIR"; }; then
  echo "etcd: cannot create $DIR"
  exit 1
fi
# One run at a time (two test runs starting together). Daemons started below get 8>&- 9>&-, or
# they would hold the locks for as long as they run.
exec 9>"$DIR/.lock"
flock -w 120 9 || { echo "etcd: another etcd-setup.sh holds $DIR/.lock"; exit 1; }

# --- 2. the tls server's certificate ----------------------------------------------------------

key_matches() { # cert key
  [ "$(openssl x509 -in "$1" -noout -pubkey 2>/dev/null)" = "$(openssl pkey -in "$2" -pubout 2>/dev/null)" ]
}

tls_files_ok() { # what tls-setup.sh makes and this script uses
  local f
  for f in ca.pem ca.key client.pem client.key; do
    [ -s "$TLS_DIR/$f" ] || return 1
  done
}

cert_ok() {
  [ -s "$CERT_DIR/server.pem" ] && [ -s "$CERT_DIR/server.key" ] || return 1
  openssl x509 -in "$CERT_DIR/server.pem" -noout -checkend 86400 >/dev/null 2>&1 || return 1
  # Signed by the current test CA (tls-setup.sh makes a new one when the old one is unusable).
  openssl verify -CAfile "$TLS_DIR/ca.pem" -purpose sslserver "$CERT_DIR/server.pem" >/dev/null 2>&1 \
    && openssl verify -CAfile "$TLS_DIR/ca.pem" -purpose sslclient "$CERT_DIR/server.pem" >/dev/null 2>&1 \
    && key_matches "$CERT_DIR/server.pem" "$CERT_DIR/server.key"
}

make_cert() {
  local tmp
  install -d -m 0700 "$CERT_DIR" || return 1
  tmp=$(mktemp -d "$CERT_DIR/.new.XXXXXX") || return 1
  # No set -e here: make_cert runs in a condition, where bash ignores it. Every step is chained.
  (
    cd "$tmp" && cat >ext.cnf <<'EOF'
[etcd]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout server.key -out server.csr -subj "/O=fencegate tests/CN=localhost" \
      && openssl x509 -req -in server.csr -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$LEAF_DAYS" -extfile ext.cnf -extensions etcd \
        -out server.pem \
      && chmod 0600 server.key && chmod 0644 server.pem
  ) >"$tmp/openssl.log" 2>&1 || {
    cat "$tmp/openssl.log" >&2
    rm -rf "$tmp"
    return 1
  }
  mv -f "$tmp/server.key" "$CERT_DIR/server.key" && mv -f "$tmp/server.pem" "$CERT_DIR/server.pem"
  local rc=$?
  rm -rf "$tmp"
  return "$rc"
}

tls_ready=0
if ! command -v openssl >/dev/null 2>&1; then
  fail "etcd tls: openssl not installed"
elif ! tls_files_ok; then
  fail "etcd tls: the test certificates are missing in $TLS_DIR (ca.pem, ca.key, client.pem, client.key; scripts/tls-setup.sh makes them)"
elif cert_ok; then
  tls_ready=1
else
  # Under tls-setup.sh's lock, so that the CA does not change while it signs.
  exec 8>"$TLS_DIR/.lock"
  if ! flock -w 120 8; then
    fail "etcd tls: another tls-setup.sh holds $TLS_DIR/.lock"
  elif tls_files_ok && make_cert && cert_ok; then
    echo "etcd tls: certificate made in $CERT_DIR"
    tls_ready=1
  else
    fail "etcd tls: could not make its certificate in $CERT_DIR"
  fi
  exec 8>&-
fi

# --- 3. the servers ---------------------------------------------------------------------------

TLS_CLIENT=(--cacert "$TLS_DIR/ca.pem" --cert "$TLS_DIR/client.pem" --key "$TLS_DIR/client.key")

answers() { # url [curl args...]: the server answers through its JSON gateway (no token needed)
  local url=$1
  shift
  curl -s -m 3 "$@" -X POST "$url/v3/maintenance/status" -d '{}' 2>/dev/null | grep -q '"header"'
}

# Starts one server unless it answers. The extra arguments go to etcd.
server_step() { # name url client-port peer-port [etcd args...]
  local name=$1 url=$2 port=$3 peer=$4
  shift 4
  local data="$DIR/$name" log="/var/log/fencegate-test-etcd-$name.log"
  local pidfile="/run/fencegate-test-etcd-$name.pid" pid label="etcd $name" curl_args=()
  [ "$name" = tls ] && curl_args=("${TLS_CLIENT[@]}")
  if answers "$url" "${curl_args[@]}"; then
    echo "$label: up"
    return 0
  fi
  # An instance of ours that does not answer (hung, or started with an older test CA).
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $data "; then
      echo "$label: stopping its old instance (pid $pid), which does not answer"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
      if alive "$pid"; then kill -9 "$pid" 2>/dev/null; sleep 0.5; fi
    fi
    rm -f "$pidfile"
  fi
  if port_open "$port"; then
    fail "$label: 127.0.0.1:$port is taken by something that does not answer as etcd ($url)"
    return 1
  fi
  if port_open "$peer"; then
    fail "$label: its peer port 127.0.0.1:$peer is taken"
    return 1
  fi
  echo "$label: starting"
  # etcd wants its data directory private.
  if ! { mkdir -p "$data" && chmod 0700 "$data"; }; then
    fail "$label: cannot create $data"
    return 1
  fi
  echo "--- started by scripts/etcd-setup.sh at $(date -u '+%F %T') UTC" >>"$log"
  # No job control here, so setsid execs etcd itself (no fork) and $! is etcd's pid; setsid and
  # nohup keep it running after this script and its session end.
  setsid nohup etcd --name "fencegate-test-$name" --data-dir "$data" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "fencegate-test-$name=http://127.0.0.1:$peer" \
    --initial-cluster-state new --initial-cluster-token "fencegate-test-$name" \
    --auto-compaction-mode=revision --auto-compaction-retention=10000 \
    --logger=zap --log-outputs=stderr "$@" \
    </dev/null >>"$log" 2>&1 8>&- 9>&- &
  pid=$!
  echo "$pid" >"$pidfile"
  for _ in $(seq 1 40); do
    answers "$url" "${curl_args[@]}" && break
    alive "$pid" || break
    sleep 0.25
  done
  if answers "$url" "${curl_args[@]}"; then
    echo "$label: up"
  else
    fail "$label: did not come up (see $log)"
    return 1
  fi
}

server_step plain http://127.0.0.1:2379 2379 2380 \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379

if [ "$tls_ready" = 1 ]; then
  server_step tls https://localhost:2381 2381 2382 \
    --listen-client-urls https://127.0.0.1:2381 --advertise-client-urls https://localhost:2381 \
    --cert-file "$CERT_DIR/server.pem" --key-file "$CERT_DIR/server.key" \
    --trusted-ca-file "$TLS_DIR/ca.pem" --client-cert-auth=true
  # It must turn away a client without a certificate.
  if answers https://localhost:2381 --cacert "$TLS_DIR/ca.pem"; then
    fail "etcd tls: 2381 answers a client without a certificate"
  fi
else
  fail "etcd tls: not started"
fi

# --- 4. authentication on the auth server -----------------------------------------------------

AUTH_URL=http://127.0.0.1:2383
CTL=(etcdctl --endpoints="$AUTH_URL" --dial-timeout=3s --command-timeout=10s)

ctl() { # etcdctl args...: runs it, printing its output only when it fails
  local out
  out=$("${CTL[@]}" "$@" 2>&1) || { echo "etcd auth: etcdctl $* failed: $out"; return 1; }
}

user_step() { # name password: the user exists with this password
  if "${CTL[@]}" user get "$1" >/dev/null 2>&1; then
    ctl user passwd "$1" --interactive=false <<<"$2"
  else
    ctl user add "$1:$2"
  fi
}

# Every step also works when an earlier run stopped half-way: granting twice is harmless.
enable_auth() {
  { "${CTL[@]}" role get root >/dev/null 2>&1 || ctl role add root; } \
    && user_step root "$ROOT_PASSWORD" \
    && ctl user grant-role root root \
    && { "${CTL[@]}" role get "$TEST_USER" >/dev/null 2>&1 || ctl role add "$TEST_USER"; } \
    && ctl role grant-permission "$TEST_USER" --prefix=true readwrite "$TEST_PREFIX" \
    && user_step "$TEST_USER" "$TEST_PASSWORD" \
    && ctl user grant-role "$TEST_USER" "$TEST_USER" \
    && ctl auth enable
}

# The test user gets a token, and with it reads under the test prefix.
auth_works() {
  local token key
  token=$(curl -s -m 3 -X POST "$AUTH_URL/v3/auth/authenticate" \
    -d "{\"name\":\"$TEST_USER\",\"password\":\"$TEST_PASSWORD\"}" 2>/dev/null \
    | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
  [ -n "$token" ] || return 1
  key=$(printf '%sprobe' "$TEST_PREFIX" | base64 -w0)
  curl -s -m 3 -X POST -H "Authorization: $token" "$AUTH_URL/v3/kv/range" -d "{\"key\":\"$key\"}" \
    2>/dev/null | grep -q '"header"'
}

if server_step auth "$AUTH_URL" 2383 2384 \
  --listen-client-urls "$AUTH_URL" --advertise-client-urls "$AUTH_URL"; then
  # Without authentication anyone may list the users; with it, no one without a token.
  if "${CTL[@]}" user list >/dev/null 2>&1; then
    if enable_auth; then
      echo "etcd auth: authentication enabled (users root and $TEST_USER)"
    else
      fail "etcd auth: could not enable authentication"
    fi
  fi
  if ! auth_works; then
    fail "etcd auth: user $TEST_USER (password $TEST_PASSWORD) cannot read under $TEST_PREFIX on $AUTH_URL"
  fi
fi

exit "$failed"
