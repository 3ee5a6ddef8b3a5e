#!/usr/bin/env bash
# Accepted fenced writes per second on each store backend (embedded, PostgreSQL, Redis, etcd), side by
# side with a gateway's passthrough route (mode = "off") and the upstream called directly, in one run.
#
#   benches/fenced-writes.sh            # 5 rounds of 10 s per path, c=64 (ROUNDS, SECS, CONNS, KEYS)
#   PATHS="..." benches/fenced-writes.sh  # other paths: direct, nginx (proxy_pass reference),
#                                         # haproxy (HAProxy, http-reuse always, a thread per core),
#                                         # nginx-logged (nginx proxy_pass writing its access log to
#                                         # a file, beside logged-passthrough),
#                                         # passthrough, fenced-BACKEND,
#                                         # idem-BACKEND (idempotent writes, unique keys), and
#                                         # SHAPE-ORDERING-BACKEND with SHAPE = spread | hot (one key),
#                                         # ORDERING = serialize | none (benches/ordering.sh uses these),
#                                         # logged-passthrough / logged-fenced (the first backend's
#                                         # passthrough and fenced writes with the default logging:
#                                         # info, a JSON access line per request, to a file),
#                                         # baseline (passthrough through the build BASELINE_BIN names,
#                                         # for an A/B of two builds in one run),
#                                         # passthrough-tls-listener / nginx-tls-listener (TLS from
#                                         # the client, plain to the upstream), passthrough-tls-upstream /
#                                         # nginx-tls-upstream (plain from the client, TLS to an nginx
#                                         # upstream, kept alive), passthrough-tls-both,
#                                         # held-plain / held-watch / held-strict (holders of 64 etcd
#                                         # locks, no authority, the watch, require_live_lease + strict),
#                                         # held-zk-watch / held-zk-strict (the same with 64 ZooKeeper
#                                         # locks at 127.0.0.1:2181, made with kazoo)
#   FENCEGATE_BIN=path benches/fenced-writes.sh  # measure that build instead of target/release
#
# PostgreSQL (127.0.0.1:5432, database test, schema fencegate_bench, recreated), Redis
# (127.0.0.1:6379, keys under fencegate-bench:*, deleted afterwards) and etcd (127.0.0.1:2379,
# keys under fencegate-bench/<time>/, deleted afterwards) must be running; the script starts them
# with scripts/ensure-services.sh when they are installed.
#
# Every fenced request carries a new, larger token for its key (a real durable advance, not a
# repeat of a known token): request n writes key n % KEYS with token BASE + n. The upstream is
# nginx answering `return 200` with keep-alive (installed from Debian if missing); load is wrk.
#
# The TLS paths use one throw-away CA (benches/tls.sh, made with openssl in the work directory)
# for fencegate and nginx alike; before measuring, the script checks that one request on each TLS
# path is answered 200 and that a route trusting another CA is answered 502 upstream-tls, and
# stops otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

ROUNDS=${ROUNDS:-5}
SECS=${SECS:-10}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
UPSTREAM_PORT=${UPSTREAM_PORT:-19000}
NGINX_PROXY_PORT=${NGINX_PROXY_PORT:-19001}
GATEWAY_PORT=${GATEWAY_PORT:-18080}
UPSTREAM_TLS_PORT=${UPSTREAM_TLS_PORT:-19002}
NGINX_TLS_LISTENER_PORT=${NGINX_TLS_LISTENER_PORT:-19003}
NGINX_TLS_UPSTREAM_PORT=${NGINX_TLS_UPSTREAM_PORT:-19004}
HAPROXY_PORT=${HAPROXY_PORT:-19005}
NGINX_LOGGED_PORT=${NGINX_LOGGED_PORT:-19006}
TLS_GATEWAY_PORT=${TLS_GATEWAY_PORT:-18090}
BACKENDS=${BACKENDS:-"embedded postgres redis"}
PATHS=${PATHS:-"direct passthrough $(for b in $BACKENDS; do printf 'fenced-%s ' "$b"; done)"}
REDIS_PREFIX="fencegate-bench:$(date +%s):"
ETCD_URL=http://127.0.0.1:2379
ETCD_PREFIX="fencegate-bench/$(date +%s)/"

# shellcheck source=benches/common.sh
source benches/common.sh
# shellcheck source=benches/tls.sh
source benches/tls.sh
need wrk wrk
need nginx nginx-light
case " $PATHS " in *" haproxy "*) need haproxy haproxy ;; esac

scripts/ensure-services.sh >/dev/null
PGOPTIONS="--client-min-messages=warning" psql -q -h 127.0.0.1 -U postgres -d test -c "DROP SCHEMA IF EXISTS fencegate_bench CASCADE" >/dev/null

work=$(mktemp -d)
gateway_pids=()
cleanup() {
  for pid in "${gateway_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pidfile in "$work/nginx.pid" "$work/upstream.pid" "$work/haproxy.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  # pgbench_upserts runs in a command substitution, so its schema name is not known here.
  case " $PATHS " in
    *" pgbench-upsert "*) psql -q -h 127.0.0.1 -U postgres -d test -c "DROP SCHEMA IF EXISTS fencegate_pgbench CASCADE" >/dev/null 2>&1 || true ;;
  esac
  redis-cli --scan --pattern "${REDIS_PREFIX}*" 2>/dev/null | xargs -r -n 500 redis-cli del >/dev/null 2>&1 || true
  etcd_delete_prefix "$ETCD_PREFIX" || true
  if [ -n "${zk_root:-}" ] && [ -s "$work/zheld-tokens.lua" ]; then
    python3 -c 'import sys; from kazoo.client import KazooClient; zk = KazooClient(hosts="127.0.0.1:2181"); zk.start(timeout=10); zk.delete(sys.argv[1], recursive=True); zk.stop()' "$zk_root" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The TLS paths' certificates and the nginx servers that use them (none without a TLS path).
upstream_tls_server="" nginx_tls_servers=""
case " $PATHS " in
  *-tls-*)
    tls_certs "$work/tls"
    upstream_tls_server=$(tls_nginx_upstream_server "$work/tls" "$UPSTREAM_TLS_PORT")
    nginx_tls_servers=$(tls_nginx_proxy_servers "$work/tls" "$UPSTREAM_TLS_PORT" "$NGINX_TLS_LISTENER_PORT" "$NGINX_TLS_UPSTREAM_PORT") ;;
esac

# Two nginx instances, so the reference proxy's CPU time can be read apart from the upstream's.
cat > "$work/upstream.conf" <<NGINX
worker_processes 1;
pid $work/upstream.pid;
error_log $work/upstream-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$UPSTREAM_PORT;
    location / { return 200 "ok"; }
  }
$upstream_tls_server
}
NGINX
# The reference proxy: nginx proxy_pass with upstream keep-alive, in front of the same upstream,
# with as many workers as fencegate has runtime threads (one per core).
cat > "$work/nginx.conf" <<NGINX
worker_processes ${NGINX_WORKERS:-auto};
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream origin {
    server 127.0.0.1:$UPSTREAM_PORT;
    keepalive 256;
  }
  server {
    listen 127.0.0.1:$NGINX_PROXY_PORT;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
  # The same proxy writing nginx's default (combined) access log to a file, for nginx-logged.
  server {
    listen 127.0.0.1:$NGINX_LOGGED_PORT;
    access_log $work/nginx-access.log;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
$nginx_tls_servers
}
NGINX
nginx -c "$work/upstream.conf"
nginx -c "$work/nginx.conf"

# The second reference proxy: HAProxy in front of the same upstream, with a thread per core (as
# fencegate has), idle upstream connections shared by every client (http-reuse always) and no log.
case " $PATHS " in
  *" haproxy "*)
    cat > "$work/haproxy.cfg" <<HAPROXY
global
  nbthread $(nproc)
  maxconn 8192
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend bench
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend origin
backend origin
  server upstream 127.0.0.1:$UPSTREAM_PORT
HAPROXY
    haproxy -q -D -p "$work/haproxy.pid" -f "$work/haproxy.cfg"
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$HAPROXY_PORT") 2>/dev/null && break; sleep 0.1; done
    ;;
esac

store_table() {
  case $1 in
    embedded) printf '[store]\nbackend = "embedded"\npath = "%s/fencegate.db"\n' "$work" ;;
    # Plain, as before the TLS work: the local server offers TLS and sqlx's default (prefer) would take it.
    postgres) printf '[store]\nbackend = "postgres"\nurl = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"\nschema = "fencegate_bench"\n' ;;
    redis) printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:6379"\nkey_prefix = "%s"\n' "$REDIS_PREFIX" ;;
    etcd) printf '[store]\nbackend = "etcd"\nendpoints = ["%s"]\nkey_prefix = "%sstore/"\n' "$ETCD_URL" "$ETCD_PREFIX" ;;
  esac
}

# FENCEGATE_BIN: another build to measure (e.g. an older commit's, for a before/after).
if [ -z "${FENCEGATE_BIN:-}" ]; then
  cargo build --release --locked --quiet --bin fencegate
  FENCEGATE_BIN=target/release/fencegate
fi
declare -A port gateway_pid
next_port=$GATEWAY_PORT
for backend in $BACKENDS; do
  port[$backend]=$next_port
  next_port=$((next_port + 1))
  mkdir -p "$work/$backend"
  cat > "$work/$backend.toml" <<TOML
[server]
listen = "127.0.0.1:${port[$backend]}"
state_dir = "$work/$backend"
$(store_table "$backend")
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[[routes]]
name = "payouts"
path = "/payouts/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "payout:{id}"
[routes.idempotency]
key = "payout:{id}"
[[routes]]
name = "unordered"
path = "/unordered/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[routes.fence]
ordering = "none"
[[routes]]
name = "plain"
path = "/plain/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
[routes.fence]
mode = "off"
TOML
  RUST_LOG=error "$FENCEGATE_BIN" serve --config "$work/$backend.toml" &
  gateway_pids+=($!)
  gateway_pid[$backend]=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/${port[$backend]}") 2>/dev/null && break; sleep 0.1; done
  # An open port is not enough: something else may be listening there (the gateway then exits).
  sleep 0.2
  kill -0 "${gateway_pid[$backend]}" 2>/dev/null ||
    { echo "fenced-writes.sh: the $backend gateway did not start (port ${port[$backend]} taken?)" >&2; exit 1; }
done
first_backend=${BACKENDS%% *}

# Another build's passthrough, on the first backend's configuration with its own port and state.
case " $PATHS " in
  *" baseline "*)
    [ -x "${BASELINE_BIN:-}" ] || { echo "fenced-writes.sh: the baseline path needs BASELINE_BIN=<a fencegate binary>" >&2; exit 1; }
    baseline_port=$next_port
    mkdir -p "$work/baseline"
    sed -e "s|^listen = .*|listen = \"127.0.0.1:$baseline_port\"|" \
        -e "s|^state_dir = .*|state_dir = \"$work/baseline\"|" \
        -e "s|$work/fencegate.db|$work/baseline/fencegate.db|" \
        "$work/$first_backend.toml" > "$work/baseline.toml"
    RUST_LOG=error "$BASELINE_BIN" serve --config "$work/baseline.toml" &
    gateway_pids+=($!)
    baseline_pid=$!
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$baseline_port") 2>/dev/null && break; sleep 0.1; done
    sleep 0.2
    kill -0 "$baseline_pid" 2>/dev/null || { echo "fenced-writes.sh: the baseline gateway did not start" >&2; exit 1; }
    ;;
esac

# The access log's cost: the first backend's gateway again, logging as it does by default (info,
# one JSON access line per request, written to a file as a log shipper would read stderr).
case " $PATHS " in
  *" logged-"*)
    logged_port=$next_port
    next_port=$((next_port + 1))
    mkdir -p "$work/logged"
    sed -e "s|^listen = .*|listen = \"127.0.0.1:$logged_port\"|" \
        -e "s|^state_dir = .*|state_dir = \"$work/logged\"|" \
        -e "s|$work/fencegate.db|$work/logged/fencegate.db|" \
        "$work/$first_backend.toml" > "$work/logged.toml"
    RUST_LOG=info "$FENCEGATE_BIN" serve --config "$work/logged.toml" --log-format json \
      2>"$work/logged/stderr.jsonl" &
    gateway_pids+=($!)
    logged_pid=$!
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$logged_port") 2>/dev/null && break; sleep 0.1; done
    sleep 0.2
    kill -0 "$logged_pid" 2>/dev/null || { echo "fenced-writes.sh: the logged gateway did not start" >&2; exit 1; }
    ;;
esac

# start_gateway NAME PORT: fencegate on $work/NAME.toml, which listens on PORT.
start_gateway() {
  local name=$1
  port[$name]=$2
  RUST_LOG=error "$FENCEGATE_BIN" serve --config "$work/$name.toml" &
  gateway_pids+=($!)
  gateway_pid[$name]=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && break; sleep 0.1; done
  sleep 0.2
  kill -0 "${gateway_pid[$name]}" 2>/dev/null ||
    { echo "fenced-writes.sh: the $name gateway did not start (port $2 taken?)" >&2; exit 1; }
}

# tls_check STATUS URL [CURL ARGS]: stops the script unless one request to URL is answered STATUS;
# the body is left in $work/tls/check.body.
tls_check() {
  local want=$1 url=$2 status
  shift 2
  status=$(curl -sS -o "$work/tls/check.body" -w '%{http_code}' "$@" "$url") || status="no answer"
  [ "$status" = "$want" ] ||
    { echo "fenced-writes.sh: $url answered $status, expected $want: $(head -c 300 "$work/tls/check.body")" >&2; exit 1; }
}

# The TLS paths' gateways, then one request on each TLS path and the verification check, before
# anything is measured.
case " $PATHS " in
  *-tls-*)
    tls_port=$TLS_GATEWAY_PORT
    plain_upstream=http://127.0.0.1:$UPSTREAM_PORT tls_upstream=https://127.0.0.1:$UPSTREAM_TLS_PORT
    for spec in "tls-listener tls $plain_upstream" "tls-upstream plain $tls_upstream" "tls-both tls $tls_upstream"; do
      read -r name listener upstream <<<"$spec"
      mkdir -p "$work/$name"
      {
        tls_gateway_toml "$work/tls" "$work/$name" "$tls_port" "$listener" "$upstream"
        [ "$name" != tls-upstream ] || tls_wrong_ca_route "$work/tls" "$tls_upstream"
      } >"$work/$name.toml"
      start_gateway "$name" "$tls_port"
      tls_port=$((tls_port + 1))
    done
    ca=(--cacert "$work/tls/ca.crt")
    tls_check 200 "https://127.0.0.1:${port[tls-listener]}/plain/1" "${ca[@]}"
    tls_check 200 "http://127.0.0.1:${port[tls-upstream]}/plain/1"
    tls_check 200 "https://127.0.0.1:${port[tls-both]}/plain/1" "${ca[@]}"
    tls_check 200 "https://127.0.0.1:$NGINX_TLS_LISTENER_PORT/plain/1" "${ca[@]}"
    tls_check 200 "http://127.0.0.1:$NGINX_TLS_UPSTREAM_PORT/plain/1"
    tls_check 502 "http://127.0.0.1:${port[tls-upstream]}/wrong-ca/1"
    problem_type=$(grep -o '"type" *: *"[^"]*"' "$work/tls/check.body" | sed 's/.*: *"\(.*\)"/\1/' || true)
    case $problem_type in
      *upstream-tls*) echo "fenced-writes.sh: wrong CA: 502, problem type $problem_type" >&2 ;;
      *) echo "fenced-writes.sh: wrong CA: 502 without an upstream-tls problem type: $(head -c 300 "$work/tls/check.body")" >&2; exit 1 ;;
    esac ;;
esac

# The stale paths' keys get a mark far above the token their requests carry (a claim, which
# also puts the mark in the gateway's cache).
for backend in $BACKENDS; do
  case " $PATHS " in
    *" stale-$backend "*)
      for i in $(seq 0 99); do
        curl -fsS -o /dev/null -X POST -H "X-Fence: 1000000000000" \
          "http://127.0.0.1:${port[$backend]}/_fencegate/claim/invoice:stale-$i"
      done ;;
  esac
done

# The held paths: 64 etcd locks taken as etcd's recipe takes them (a key <lock>/<lease hex> under
# a 10-minute lease; its create revision is the holder's token), and a gateway on the embedded
# store whose three routes differ only in their authority. Each request is a holder's write with
# its own token (repeated: compare = "monotonic" lets a holder write many times).
case " $PATHS " in
  *" held-"*)
    : >"$work/held-tokens.lua"
    echo "tokens = {" >>"$work/held-tokens.lua"
    for i in $(seq 0 63); do
      lease=$(curl -fsS "$ETCD_URL/v3/lease/grant" -d '{"TTL":"600"}' | sed 's/.*"ID":"\([0-9]*\)".*/\1/')
      key=$(printf '%slocks/%s/%x' "$ETCD_PREFIX" "$i" "$lease" | base64 -w0)
      revision=$(curl -fsS "$ETCD_URL/v3/kv/put" -d "{\"key\":\"$key\",\"value\":\"aA==\",\"lease\":\"$lease\"}" |
        sed 's/.*"revision":"\([0-9]*\)".*/\1/')
      echo "  [$i] = \"$revision\"," >>"$work/held-tokens.lua"
    done
    echo "}" >>"$work/held-tokens.lua"
    authority() {
      printf '[routes.fence.authority]\nkind = "etcd"\nendpoints = ["%s"]\nlock_key = "%slocks/{id}"\nresource_key = "held:{id}"\n%s\n' \
        "$ETCD_URL" "$ETCD_PREFIX" "$1"
    }
    # The held-zk paths: 64 ZooKeeper locks, each a lock node with one sequential child (held by
    # no session: persistent, so that it outlives this script's client), made with kazoo.
    zk_root="/fencegate-bench-$(date +%s)"
    case " $PATHS " in
      *" held-zk-"*)
        python3 - "$zk_root" >"$work/zheld-tokens.lua" <<'PY'
import sys
from kazoo.client import KazooClient
root = sys.argv[1]
zk = KazooClient(hosts="127.0.0.1:2181")
zk.start(timeout=10)
print("tokens = {")
for i in range(64):
    lock = f"{root}/locks/{i}"
    zk.ensure_path(lock)
    zk.delete(zk.create(f"{lock}/lock-", sequence=True))  # the tokens start at 1
    node = zk.create(f"{lock}/lock-", sequence=True)
    print(f'  [{i}] = "{int(node[-10:])}",')
print("}")
zk.stop()
PY
        ;;
    esac
    zk_authority() {
      printf '[routes.fence.authority]\nkind = "zookeeper"\nhosts = "127.0.0.1:2181"\nlock_key = "%s/locks/{id}"\nresource_key = "zheld:{id}"\n%s\n' \
        "$zk_root" "$1"
    }
    mkdir -p "$work/held"
    {
      printf '[server]\nlisten = "127.0.0.1:%s"\nstate_dir = "%s/held"\n' "$next_port" "$work"
      printf '[store]\nbackend = "embedded"\npath = "%s/held/fencegate.db"\n' "$work"
      for mode in plain watch strict; do
        printf '[[routes]]\nname = "held-%s"\npath = "/held-%s/{id}"\nupstream = "http://127.0.0.1:%s"\nresource_key = "held:{id}"\n' \
          "$mode" "$mode" "$UPSTREAM_PORT"
        case $mode in
          watch) authority "" ;;
          strict) authority $'require_live_lease = true\nstrict = true' ;;
        esac
      done
      if [ -s "$work/zheld-tokens.lua" ]; then
        for mode in watch strict; do
          printf '[[routes]]\nname = "held-zk-%s"\npath = "/held-zk-%s/{id}"\nupstream = "http://127.0.0.1:%s"\nresource_key = "zheld:{id}"\n' \
            "$mode" "$mode" "$UPSTREAM_PORT"
          case $mode in
            watch) zk_authority "" ;;
            strict) zk_authority $'require_live_lease = true\nstrict = true' ;;
          esac
        done
      fi
    } >"$work/held.toml"
    start_gateway held "$next_port"
    next_port=$((next_port + 1))
    # Every held path answers its holders before anything is measured.
    zk_modes=""
    [ -s "$work/zheld-tokens.lua" ] && zk_modes="zk-watch zk-strict"
    for mode in plain watch strict $zk_modes; do
      tokens_file="$work/held-tokens.lua"
      case $mode in zk-*) tokens_file="$work/zheld-tokens.lua" ;; esac
      token=$(sed -n 's/  \[0\] = "\([0-9]*\)",/\1/p' "$tokens_file")
      for _ in $(seq 1 50); do
        status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "X-Fence: $token" "http://127.0.0.1:${port[held]}/held-$mode/0")
        [ "$status" = 200 ] && break
        sleep 0.1
      done
      [ "$status" = 200 ] || { echo "fenced-writes.sh: held-$mode answered $status to its holder" >&2; exit 1; }
    done ;;
esac
for held in held zheld; do
cat > "$work/$held.lua" <<LUA
dofile("$work/$held-tokens.lua")
local n = 0
local prefix = os.getenv("PREFIX")
request = function()
  n = n + 1
  local i = n % 64
  return wrk.format("POST", prefix .. i, { ["X-Fence"] = tokens[i] }, "")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
done

cat > "$work/advance.lua" <<'LUA'
local n = 0
local keys = tonumber(os.getenv("KEYS"))
local base = tonumber(os.getenv("BASE"))
local prefix = os.getenv("PREFIX")
request = function()
  n = n + 1
  return wrk.format("POST", prefix .. (n % keys), { ["X-Fence"] = string.format("%.0f", base + n) }, "")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
# Idempotent writes with unique keys: every request a new payout, so each records an intent and
# an outcome and is forwarded.
cat > "$work/unique.lua" <<'LUA'
local n = 0
local base = tonumber(os.getenv("BASE"))
request = function()
  n = n + 1
  local id = string.format("%.0f", base + n)
  return wrk.format("POST", "/payouts/" .. id, { ["X-Fence"] = id }, "{}")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
# One hot key: every request carries the same (current) token, so each is accepted.
cat > "$work/hot.lua" <<'LUA'
local token = string.format("%.0f", tonumber(os.getenv("BASE")))
local prefix = os.getenv("PREFIX")
request = function() return wrk.format("POST", prefix .. "hot", { ["X-Fence"] = token }, "") end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
# Stale writes: every request carries token 1 for a key whose mark is far above it (claimed
# below), so the cache refuses it with 409 and nothing goes to the store or the upstream.
cat > "$work/stale.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", "/invoices/stale-" .. (n % 100), { ["X-Fence"] = "1" }, "")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
cat > "$work/plain.lua" <<'LUA'
local n = 0
request = function() n = n + 1; return wrk.format("POST", "/plain/" .. (n % 10000), {}, "") end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA


# CPU time (user + system, in clock ticks) used so far by the processes $CPU_PIDS, threads included.
cpu_ticks() {
  local total=0 pid
  for pid in $CPU_PIDS; do
    total=$(( total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0) ))
  done
  echo "$total"
}
TICK_US=$(( 1000000 / $(getconf CLK_TCK) ))

# Context switches of the processes $CPU_PIDS (threads included) while they run, counted by
# `perf stat` (a software event, so it works where the VM has no hardware counters); starts the
# count in the background and prints its pid, or nothing without perf.
start_switch_count() {
  command -v perf >/dev/null 2>&1 || return 0
  local pids
  pids=$(tr -s ' ' ',' <<<"$CPU_PIDS" | sed 's/^,//; s/,$//')
  perf stat -x, -e context-switches -p "$pids" -o "$work/switches.txt" >/dev/null 2>&1 &
  echo $!
}
stop_switch_count() {
  local pid=$1
  [ -n "$pid" ] || return 0
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  awk -F, '$3 == "context-switches" {print $1}' "$work/switches.txt" 2>/dev/null
}

# One wrk run; prints "req/s p50_us p99_us non2xx cpu_us_per_request switches_per_request" (the
# last two are "-" unless CPU_PIDS names the process under test).
run() {
  local url=$1 script=$2 prefix=${3:-/invoices/}
  local out before after counting="" switches=""
  before=$(cpu_ticks)
  [ -n "${CPU_PIDS:-}" ] && counting=$(start_switch_count)
  out=$(BASE=$(( $(date +%s%N) / 1000 )) KEYS=$KEYS PREFIX=$prefix wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$script" "$url")
  after=$(cpu_ticks)
  switches=$(stop_switch_count "$counting")
  local rps p50 p99 bad requests cpu=- per_switch=-
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out" | to_us)
  p99=$(awk '$1=="99%" {print $2}' <<<"$out" | to_us)
  bad=$(awk '/^non2xx/ {print $2}' <<<"$out")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  # Refused connections, failed handshakes and timeouts are no HTTP status: say so, not only non2xx.
  grep 'Socket errors' <<<"$out" | sed "s|^ *|$url: |" >&2 || true
  if [ -n "${CPU_PIDS:-}" ] && [ "${requests:-0}" -gt 0 ]; then
    cpu=$(awk -v t=$(( (after - before) * TICK_US )) -v n="$requests" 'BEGIN {printf "%.1f", t / n}')
    if [ -n "$switches" ]; then
      per_switch=$(awk -v s="$switches" -v n="$requests" 'BEGIN {printf "%.3f", s / n}')
    fi
  fi
  echo "$rps $p50 $p99 $bad $cpu $per_switch"
}

# The reference for PostgreSQL: one `INSERT ... ON CONFLICT ... DO UPDATE ... WHERE` per
# transaction, straight from pgbench (no HTTP at all) with PGBENCH_CLIENTS clients (default 16:
# the gateways' pools hold up to 80 connections of their own, and PostgreSQL's default limit is
# 100); prints a
# line in run()'s format (latencies from pgbench's average, non2xx 0).
PGBENCH_SCHEMA=""
pgbench_upserts() {
  if [ -z "$PGBENCH_SCHEMA" ]; then
    PGBENCH_SCHEMA=fencegate_pgbench
    psql -q -h 127.0.0.1 -U postgres -d test <<SQL >/dev/null
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS $PGBENCH_SCHEMA CASCADE;
CREATE SCHEMA $PGBENCH_SCHEMA;
CREATE TABLE $PGBENCH_SCHEMA.marks (key text PRIMARY KEY, mark numeric(20, 0) NOT NULL);
SQL
    cat > "$work/upsert.sql" <<SQL
\\set k random(0, $((KEYS - 1)))
INSERT INTO $PGBENCH_SCHEMA.marks AS m (key, mark) VALUES ('invoice:' || :k, (extract(epoch from clock_timestamp()) * 1000000)::bigint)
  ON CONFLICT (key) DO UPDATE SET mark = excluded.mark WHERE m.mark <= excluded.mark RETURNING m.mark;
SQL
  fi
  local out tps lat
  out=$(pgbench -h 127.0.0.1 -U postgres -n -c "${PGBENCH_CLIENTS:-16}" -j 1 -T "$SECS" -f "$work/upsert.sql" test 2>&1) || true
  tps=$(awk '/^tps/ {print $3}' <<<"$out")
  [ -n "$tps" ] || { echo "pgbench failed: $(tail -n 3 <<<"$out")" >&2; tps=0; }
  lat=$(awk '/latency average/ {print $4 * 1000}' <<<"$out")
  echo "$tps $lat - 0 - -"
}


# The reference proxy's master and workers, for CPU_PIDS.
nginx_cpu_pids() { echo "$(cat "$work/nginx.pid") $(pgrep -P "$(cat "$work/nginx.pid")" | tr '\n' ' ')"; }

paths=$PATHS

declare -A results
for round in $(seq 1 "$ROUNDS"); do
  for path in $paths; do
    CPU_PIDS=""
    case $path in
      direct) line=$(run "http://127.0.0.1:$UPSTREAM_PORT/plain/1" "$work/plain.lua") ;;
      nginx)
        CPU_PIDS=$(nginx_cpu_pids)
        line=$(run "http://127.0.0.1:$NGINX_PROXY_PORT/plain/1" "$work/plain.lua") ;;
      nginx-logged)
        CPU_PIDS=$(nginx_cpu_pids)
        line=$(run "http://127.0.0.1:$NGINX_LOGGED_PORT/plain/1" "$work/plain.lua") ;;
      haproxy)
        CPU_PIDS=$(cat "$work/haproxy.pid")
        line=$(run "http://127.0.0.1:$HAPROXY_PORT/plain/1" "$work/plain.lua") ;;
      nginx-tls-listener)
        CPU_PIDS=$(nginx_cpu_pids)
        line=$(run "https://127.0.0.1:$NGINX_TLS_LISTENER_PORT/plain/1" "$work/plain.lua") ;;
      nginx-tls-upstream)
        CPU_PIDS=$(nginx_cpu_pids)
        line=$(run "http://127.0.0.1:$NGINX_TLS_UPSTREAM_PORT/plain/1" "$work/plain.lua") ;;
      passthrough-tls-listener | passthrough-tls-upstream | passthrough-tls-both)
        gateway=${path#passthrough-}
        CPU_PIDS=${gateway_pid[$gateway]}
        scheme=https
        [ "$gateway" = tls-upstream ] && scheme=http
        line=$(run "$scheme://127.0.0.1:${port[$gateway]}/plain/1" "$work/plain.lua") ;;
      passthrough)
        CPU_PIDS=${gateway_pid[$first_backend]}
        line=$(run "http://127.0.0.1:${port[$first_backend]}/plain/1" "$work/plain.lua") ;;
      logged-passthrough)
        CPU_PIDS=$logged_pid
        line=$(run "http://127.0.0.1:$logged_port/plain/1" "$work/plain.lua") ;;
      logged-fenced)
        CPU_PIDS=$logged_pid
        line=$(run "http://127.0.0.1:$logged_port/invoices/1" "$work/advance.lua") ;;
      baseline)
        CPU_PIDS=$baseline_pid
        line=$(run "http://127.0.0.1:$baseline_port/plain/1" "$work/plain.lua") ;;
      pgbench-upsert) line=$(pgbench_upserts) ;;
      fenced-*)
        CPU_PIDS=${gateway_pid[${path#fenced-}]}
        line=$(run "http://127.0.0.1:${port[${path#fenced-}]}/invoices/1" "$work/advance.lua") ;;
      held-zk-*)
        CPU_PIDS=${gateway_pid[held]}
        line=$(run "http://127.0.0.1:${port[held]}/$path/0" "$work/zheld.lua" "/$path/") ;;
      held-*)
        CPU_PIDS=${gateway_pid[held]}
        line=$(run "http://127.0.0.1:${port[held]}/$path/0" "$work/held.lua" "/$path/") ;;
      stale-*)
        CPU_PIDS=${gateway_pid[${path#stale-}]}
        line=$(run "http://127.0.0.1:${port[${path#stale-}]}/invoices/1" "$work/stale.lua") ;;
      idem-*)
        CPU_PIDS=${gateway_pid[${path#idem-}]}
        line=$(run "http://127.0.0.1:${port[${path#idem-}]}/payouts/1" "$work/unique.lua") ;;
      *-*-*)
        IFS=- read -r shape ordering backend <<<"$path"
        CPU_PIDS=${gateway_pid[$backend]}
        prefix=/invoices/
        [ "$ordering" = none ] && prefix=/unordered/
        line=$(run "http://127.0.0.1:${port[$backend]}$prefix" "$work/$( [ "$shape" = hot ] && echo hot || echo advance ).lua" "$prefix") ;;
    esac
    echo "round $round $path: req/s p50_us p99_us non2xx cpu_us switches = $line" >&2
    results[$path]+="$line"$'\n'
  done
done

echo
echo "wrk -t1 -c$CONNS, ${SECS}s per run, median of $ROUNDS rounds (paths alternate within each round)"
echo
echo "| path | req/s | × passthrough | p50 (µs) | p99 (µs) | non-2xx (all runs) | CPU µs/request | context switches/request |"
echo "|---|---|---|---|---|---|---|---|"
base=$(awk 'NF {print $1}' <<<"${results[passthrough]:-}" | median)
base=${base:-0}
for path in $paths; do
  rows=${results[$path]}
  rps=$(awk 'NF {print $1}' <<<"$rows" | median)
  p50=$(awk 'NF {print $2}' <<<"$rows" | median)
  p99=$(awk 'NF {print $3}' <<<"$rows" | median)
  bad=$(awk 'NF {s+=$4} END {print s+0}' <<<"$rows")
  cpu=$(awk 'NF && $5 != "-" {print $5}' <<<"$rows" | median)
  switches=$(awk 'NF >= 6 && $6 != "-" {print $6}' <<<"$rows" | median)
  ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN {if (b > 0) printf "%.2f", a / b; else printf "-"}')
  echo "| $path | $rps | $ratio | $p50 | $p99 | $bad | ${cpu:--} | ${switches:--} |"
  # Machine-readable medians for benches/run.sh.
  if [ -n "${RESULTS:-}" ]; then
    echo "$path ${rps:-0} ${p50:--} ${p99:--} $bad ${cpu:--}" >>"$RESULTS"
  fi
done
