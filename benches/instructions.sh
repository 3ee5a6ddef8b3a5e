#!/usr/bin/env bash
# User-space instructions per request, counted by callgrind, for a passthrough request (and a stale
# write refused from the cache) through fencegate, beside nginx proxy_pass and HAProxy (`http-reuse
# always`) to the same upstream.
# This VM has no hardware instruction counters (`perf stat -e instructions` says "not
# supported"), so instructions are counted by simulation: exact and repeatable, user space only.
#
#   benches/instructions.sh                       # target/release/fencegate (built if missing)
#   FENCEGATE_BIN=a BASELINE_BIN=b benches/instructions.sh   # two builds, run in turn
#   RUNS=2 SECS=8 WARMUP=3 CONNS=8 benches/instructions.sh   # the defaults
#   KEEP=dir benches/instructions.sh              # also keeps the callgrind files (callgrind_annotate)
#
# Each process under test runs alone under `valgrind --tool=callgrind --instr-atstart=no` with one
# serving thread (fencegate `workers = 1`, nginx one worker without a master, HAProxy `nbthread 1`
# in the foreground); wrk warms it up for WARMUP seconds, then counting is switched on
# (callgrind_control -i on) for SECS seconds of load, and the count is divided by the requests wrk
# completed in that window. The upstream is a separate nginx answering `return 200`. Prints one
# line per run and a table of medians.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh

RUNS=${RUNS:-2}
SECS=${SECS:-8}
WARMUP=${WARMUP:-3}
CONNS=${CONNS:-8}
UPSTREAM_PORT=${UPSTREAM_PORT:-19100}
PROXY_PORT=${PROXY_PORT:-19101}

need valgrind valgrind
need wrk wrk
need nginx nginx-light
need haproxy haproxy
if [ -z "${FENCEGATE_BIN:-}" ]; then
  cargo build --release --locked --quiet --bin fencegate
  FENCEGATE_BIN=target/release/fencegate
fi

work=$(mktemp -d)
cleanup() {
  [ -f "$work/upstream.pid" ] && kill "$(cat "$work/upstream.pid")" 2>/dev/null || true
  [ -n "${under_test:-}" ] && kill "$under_test" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/upstream.conf" <<NGINX
worker_processes 1;
pid $work/upstream.pid;
error_log $work/upstream-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UPSTREAM_PORT; location / { return 200 "ok"; } }
}
NGINX
nginx -c "$work/upstream.conf"

cat > "$work/proxy.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
pid $work/proxy.pid;
error_log $work/proxy-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:$UPSTREAM_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY_PORT;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX

cat > "$work/haproxy.cfg" <<HAPROXY
global
  nbthread 1
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend bench
  bind 127.0.0.1:$PROXY_PORT
  default_backend origin
backend origin
  server upstream 127.0.0.1:$UPSTREAM_PORT
HAPROXY

gateway_config() {
  mkdir -p "$work/state"
  cat > "$work/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$PROXY_PORT"
state_dir = "$work/state"
workers = 1
[store]
backend = "embedded"
path = "$work/state/fencegate.db"
[[routes]]
name = "plain"
path = "/plain/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
[routes.fence]
mode = "off"
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
TOML
}

cat > "$work/plain.lua" <<'LUA'
request = function() return wrk.format("POST", "/plain/1", {}, "") end
LUA
# A stale write: the key's mark is raised to 1000 first, then every request carries token 1.
cat > "$work/stale.lua" <<'LUA'
request = function() return wrk.format("POST", "/invoices/1", {["X-Fence"] = "1"}, "") end
LUA

wait_for_port() {
  for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on $1" >&2
  return 1
}

# measure NAME SCRIPT COMMAND...: starts COMMAND under callgrind, loads it, prints instructions per
# request.
measure() {
  local name=$1 script=$2
  shift 2
  local out="$work/callgrind.$name.out"
  rm -f "$out"*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$@" \
    >"$work/$name.log" 2>&1 &
  under_test=$!
  wait_for_port "$PROXY_PORT"
  if [ "$script" = stale.lua ]; then
    curl -s -o /dev/null -X POST -H 'X-Fence: 1000' "http://127.0.0.1:$PROXY_PORT/invoices/1"
    local status
    status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'X-Fence: 1' "http://127.0.0.1:$PROXY_PORT/invoices/1")
    [ "$status" = 409 ] || { echo "a stale write was answered $status, not 409" >&2; return 1; }
  fi
  wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$work/$script" "http://127.0.0.1:$PROXY_PORT" >/dev/null
  callgrind_control -i on "$under_test" >/dev/null 2>&1
  local requests
  requests=$(wrk -t1 -c"$CONNS" -d"${SECS}s" -s "$work/$script" "http://127.0.0.1:$PROXY_PORT" |
    awk '/requests in/ {print $1}')
  callgrind_control -i off "$under_test" >/dev/null 2>&1
  # TERM: HAProxy in the foreground ignores INT under valgrind; nginx and fencegate stop on either.
  kill -TERM "$under_test" 2>/dev/null || true
  wait "$under_test" 2>/dev/null || true
  under_test=""
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp "$out"* "$KEEP/"
  fi
  local total
  total=$(cat "$out"* | awk '/^summary:|^totals:/ {s += $2} END {print s + 0}')
  awk -v t="$total" -v n="$requests" 'BEGIN {printf "%.0f\n", t / n}'
}

declare -A results
builds=("fencegate=$FENCEGATE_BIN")
[ -n "${BASELINE_BIN:-}" ] && builds+=("baseline=$BASELINE_BIN")
gateway_config
for run in $(seq 1 "$RUNS"); do
  per=$(measure nginx plain.lua nginx -c "$work/proxy.conf")
  echo "run $run nginx passthrough: $per instructions/request" >&2
  results["nginx passthrough"]+="$per"$'\n'
  per=$(measure haproxy plain.lua haproxy -db -f "$work/haproxy.cfg")
  echo "run $run haproxy passthrough: $per instructions/request" >&2
  results["haproxy passthrough"]+="$per"$'\n'
  for build in "${builds[@]}"; do
    label=${build%%=*} bin=${build#*=}
    for path in passthrough stale; do
      script=plain.lua
      [ "$path" = stale ] && script=stale.lua
      rm -rf "$work/state"
      gateway_config
      per=$(RUST_LOG=error measure "$label-$path" "$script" "$bin" serve --config "$work/gateway.toml")
      echo "run $run $label $path: $per instructions/request" >&2
      results["$label $path"]+="$per"$'\n'
    done
  done
done

echo
echo "callgrind, one serving thread, wrk -t1 -c$CONNS, ${SECS}s counted after ${WARMUP}s, median of $RUNS runs"
echo
echo "| process and path | user-space instructions per request |"
echo "|---|---|"
for key in "nginx passthrough" "haproxy passthrough" $(for build in "${builds[@]}"; do printf '%s ' "${build%%=*}:passthrough" "${build%%=*}:stale"; done); do
  key=${key/:/ }
  echo "| $key | $(awk 'NF' <<<"${results[$key]}" | median) |"
done
