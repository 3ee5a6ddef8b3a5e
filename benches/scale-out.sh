#!/usr/bin/env bash
# The scale-out table (issue 37, item 5): accepted fenced writes per second through 1, 2 and 3
# gateway replicas sharing one store (PostgreSQL, Redis, etcd: a row group each), with
# `ordering = "none"` and `ordering = "serialize"`, on keys spread over KEYS and on HOT_KEYS hot
# keys, beside the CPU per request of the gateways and of the store, so that one can see whether
# the store, the gateways or the machine is the limit.
#
#   benches/scale-out.sh              # 3 rounds of 5 s per run, c=64 in all (ROUNDS, SECS, CONNS,
#                                     # KEYS = 10000, HOT_KEYS = 16)
#   BACKENDS="postgres redis" benches/scale-out.sh   # the row groups (default "postgres redis etcd")
#   REPLICA_COUNTS="1 2" benches/scale-out.sh        # the replica counts (default "1 2 3")
#   ORDERINGS=serialize SHAPES=hot benches/scale-out.sh  # only some rows (defaults "none serialize"
#                                                        # and "spread hot")
#   SPREAD=partition benches/scale-out.sh  # spread keys split between the replicas (replica r of N
#                                          # writes keys r, r + N, ...) instead of drawn at random
#   HOT_TOKENS=clock benches/scale-out.sh  # hot keys get a new, larger token per request too (most
#                                          # are then refused as superseded: 409)
#   FENCEGATE_BIN=path benches/scale-out.sh  # measure that build instead of target/release/fencegate
#
# This script never builds: when the binary is missing it waits for it (another build) for up to
# 20 minutes, looking every 30 s. A default run takes 11 to 12 minutes: 3 backends × 2 orderings ×
# 2 key shapes × 3 replica counts × 3 rounds × (5 s + a 1 s warm-up) = 648 s of load, plus a few
# seconds per backend to start its replicas. (ROUNDS=1 SECS=2 BACKENDS=redis: 36 s of load, about
# 45 s in all.)
#
# Each replica is its own `fencegate serve` process with its own data and admin port and its own
# state_dir (so its own replica id), all on one store namespace: PostgreSQL (127.0.0.1:5432,
# database test, schema fencegate_scaleout, recreated and dropped afterwards), Redis
# (127.0.0.1:6379, keys under fencegate-scaleout:<time>:, deleted afterwards) or etcd
# (127.0.0.1:2379, keys under fencegate-scaleout/<time>/, deleted afterwards). They are started one
# after the other, each ready before the next, so that only the first runs PostgreSQL's migrations;
# all of a backend's replicas run while its rows are measured, and an N-replica run loads the
# first N.
# scripts/ensure-services.sh starts the stores when they are installed; a backend whose store does
# not answer is skipped with a line saying so. The upstream is nginx answering `return 200` with
# keep-alive (one worker); load is wrk, one process per loaded replica, all at once (-t1, CONNS
# connections split between them; --timeout 12s, past the routes' gate_timeout of 10 s, so that a
# write kept waiting for its key's turn ends as an HTTP answer, not a wrk timeout), a 1 s warm-up
# before each measured run; the replica counts alternate within each round and every figure is
# the median of the rounds.
#
# What is measured: 2xx answers per second, summed over the replicas (non-2xx are counted apart).
# Every spread write carries a new, larger token from one clock all the wrk processes share:
# token = (CLOCK_REALTIME in µs) × 4 + replica index, so the tokens of a key grow across replicas
# (to the microsecond) and across runs, and a write is refused as stale (409) only when two writes
# of one key race (another replica's later token reached the store first, or, serialized, was
# admitted while this one waited for the key's turn). The spread key is drawn at random from KEYS,
# as behind a balancer that knows nothing of keys: on PostgreSQL under serialize a key whose turn
# another replica last held is handed over (notify, release), which is part of what is measured.
# Hot writes (ids hot0 .. hot15 by default, drawn at random) carry one token per run, the same for
# every replica, as benches/fenced-writes.sh's hot path does: compare = "monotonic" accepts a token
# equal to the mark, so every write is accepted and still makes its store round trip and,
# serialized, takes the key's turn; with a new token per request most would be superseded instead.
#
# CPU per request: user + system time from /proc over the measured run, divided by the requests
# answered: the gateways (every started replica of the backend, threads included) and the store's
# server (the process listening on the store's port: for PostgreSQL the postmaster with its
# children, i.e. every backend process plus the background writers, exited backends through the
# postmaster's children-time fields). The store's figure counts whatever else uses that server
# meanwhile. The reading under the table also counts wrk (the CPU of this shell's reaped children)
# and nginx, and the machine's busy time from /proc/stat: what is left is other work.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="$(printf '%q ' "$0" "$@")"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
HOT_KEYS=${HOT_KEYS:-16}
SPREAD=${SPREAD:-random}
HOT_TOKENS=${HOT_TOKENS:-same}
REPLICA_COUNTS=${REPLICA_COUNTS:-"1 2 3"}
ORDERINGS=${ORDERINGS:-"none serialize"}
SHAPES=${SHAPES:-"spread hot"}
BACKENDS=${BACKENDS:-"postgres redis etcd"}
UPSTREAM_PORT=${UPSTREAM_PORT:-29100}
GATEWAY_PORT=${GATEWAY_PORT:-28400}
ADMIN_PORT=${ADMIN_PORT:-28500}
FENCEGATE_BIN=${FENCEGATE_BIN:-target/release/fencegate}
PG_SCHEMA=fencegate_scaleout
REDIS_PREFIX="fencegate-scaleout:$(date +%s):"
ETCD_URL=http://127.0.0.1:2379
ETCD_PREFIX="fencegate-scaleout/$(date +%s)/"
ADMIN_TOKEN=scale-out-bench-admin-token

# shellcheck source=benches/common.sh
source benches/common.sh
need wrk wrk
need nginx nginx-light

max_replicas=0
for count in $REPLICA_COUNTS; do
  if [ "$count" -gt "$max_replicas" ]; then max_replicas=$count; fi
done
first_count=${REPLICA_COUNTS%% *}
last_count=${REPLICA_COUNTS##* }

# The exact settings of this run, as a command line that repeats it.
echo "command: ROUNDS=$ROUNDS SECS=$SECS CONNS=$CONNS KEYS=$KEYS HOT_KEYS=$HOT_KEYS SPREAD=$SPREAD HOT_TOKENS=$HOT_TOKENS REPLICA_COUNTS=\"$REPLICA_COUNTS\" ORDERINGS=\"$ORDERINGS\" SHAPES=\"$SHAPES\" BACKENDS=\"$BACKENDS\" FENCEGATE_BIN=$FENCEGATE_BIN $command_line"
echo

# The binary comes from another build: wait for it (20 minutes at most).
for _ in $(seq 1 40); do
  [ -x "$FENCEGATE_BIN" ] && break
  echo "scale-out.sh: waiting for $FENCEGATE_BIN (built elsewhere; this script does not build)" >&2
  sleep 30
done
[ -x "$FENCEGATE_BIN" ] || { echo "scale-out.sh: $FENCEGATE_BIN did not appear within 20 minutes" >&2; exit 1; }

scripts/ensure-services.sh >/dev/null

work=$(mktemp -d)
gateway_pids=()
wrk_pids=()
etcd_used=""
cleanup() {
  for pid in "${wrk_pids[@]}" "${gateway_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -f "$work/upstream.pid" ]; then kill "$(cat "$work/upstream.pid")" 2>/dev/null || true; fi
  case " $BACKENDS " in
    *" postgres "*) PGOPTIONS="--client-min-messages=warning" psql -q -h 127.0.0.1 -U postgres -d test \
      -c "DROP SCHEMA IF EXISTS $PG_SCHEMA CASCADE" >/dev/null 2>&1 || true ;;
  esac
  redis-cli --scan --pattern "${REDIS_PREFIX}*" 2>/dev/null | xargs -r -n 500 redis-cli del >/dev/null 2>&1 || true
  [ -z "$etcd_used" ] || etcd_delete_prefix "$ETCD_PREFIX" || true
  rm -rf "$work"
}
trap cleanup EXIT

# reachable BACKEND: whether its store answers.
reachable() {
  case $1 in
    postgres) psql -h 127.0.0.1 -U postgres -d test -Atc "SELECT 1" >/dev/null 2>&1 ;;
    redis) [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ] ;;
    etcd) curl -fsS -m 3 "$ETCD_URL/version" >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}
backends=""
skipped=""
for backend in $BACKENDS; do
  case $backend in
    postgres | redis | etcd) ;;
    *) skipped+="$backend: not a store replicas can share, skipped"$'\n'; continue ;;
  esac
  if reachable "$backend"; then
    backends+="$backend "
  else
    skipped+="$backend: not reachable, skipped"$'\n'
  fi
done
if [ -n "$skipped" ]; then printf '%s\n' "$skipped"; printf '%s' "$skipped" >&2; fi
[ -n "$backends" ] || { echo "scale-out.sh: no backend to measure" >&2; exit 1; }
case " $backends " in *" etcd "*) etcd_used=1 ;; esac
case " $backends " in
  *" postgres "*) PGOPTIONS="--client-min-messages=warning" psql -q -h 127.0.0.1 -U postgres -d test \
    -c "DROP SCHEMA IF EXISTS $PG_SCHEMA CASCADE" >/dev/null ;;
esac

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
}
NGINX
nginx -c "$work/upstream.conf"

store_table() {
  case $1 in
    # Plain, as in benches/fenced-writes.sh: the local server offers TLS and sqlx's default (prefer) would take it.
    postgres) printf '[store]\nbackend = "postgres"\nurl = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"\nschema = "%s"\n' "$PG_SCHEMA" ;;
    redis) printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:6379"\nkey_prefix = "%s"\n' "$REDIS_PREFIX" ;;
    etcd) printf '[store]\nbackend = "etcd"\nendpoints = ["%s"]\nkey_prefix = "%sstore/"\n' "$ETCD_URL" "$ETCD_PREFIX" ;;
  esac
}

# The store server's process: the one listening on its port.
store_port() { case $1 in postgres) echo 5432 ;; redis) echo 6379 ;; etcd) echo "${ETCD_URL##*:}" ;; esac; }
store_pid() { ss -ltnpH "sport = :$(store_port "$1")" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1; }

declare -A data_port admin_port replica_pid
# start_replica BACKEND INDEX NUMBER: replica INDEX (0-based) of BACKEND, whose ports follow from
# NUMBER (the backend's place in the list).
start_replica() {
  local backend=$1 r=$2 name="$1-$2" status=""
  data_port[$name]=$((GATEWAY_PORT + 10 * $3 + r))
  admin_port[$name]=$((ADMIN_PORT + 10 * $3 + r))
  mkdir -p "$work/$name"
  cat > "$work/$name.toml" <<TOML
[server]
listen = "127.0.0.1:${data_port[$name]}"
state_dir = "$work/$name"
[admin]
listen = "127.0.0.1:${admin_port[$name]}"
token = "$ADMIN_TOKEN"
$(store_table "$backend")
[[routes]]
name = "serialized"
path = "/serialized/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[routes.fence]
ordering = "serialize"
[[routes]]
name = "unordered"
path = "/unordered/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[routes.fence]
ordering = "none"
TOML
  RUST_LOG=error "$FENCEGATE_BIN" serve --config "$work/$name.toml" 2>>"$work/$name.log" &
  gateway_pids+=($!)
  replica_pid[$name]=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/${data_port[$name]}") 2>/dev/null && break; sleep 0.1; done
  # An open port is not enough: something else may be listening there (the gateway then exits).
  sleep 0.2
  kill -0 "${replica_pid[$name]}" 2>/dev/null ||
    { echo "scale-out.sh: replica $name did not start (port ${data_port[$name]} or ${admin_port[$name]} taken?): $(tail -n 5 "$work/$name.log")" >&2; exit 1; }
  # Ready: the store answers and is trusted (adopted), before the next replica starts.
  for _ in $(seq 1 100); do
    status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${admin_port[$name]}/readyz") || true
    [ "$status" = 200 ] && break
    sleep 0.1
  done
  [ "$status" = 200 ] || { echo "scale-out.sh: replica $name is not ready (/readyz $status): $(tail -n 5 "$work/$name.log")" >&2; exit 1; }
}

# clock_token: a token on the wrk script's scale (µs × 4), newer than every one sent before.
clock_token() { echo $(( ($(date +%s%N) / 1000) * 4 )); }

# probe BACKEND: one write per replica and route, each answered 200, before anything is measured.
probe() {
  local r name route status
  for r in $(seq 0 $((max_replicas - 1))); do
    name="$1-$r"
    for route in serialized unordered; do
      status=$(curl -s -o "$work/probe.body" -w '%{http_code}' -X POST -H "X-Fence: $(clock_token)" \
        "http://127.0.0.1:${data_port[$name]}/$route/probe") || status="no answer"
      [ "$status" = 200 ] ||
        { echo "scale-out.sh: replica $name answered $status on /$route/probe: $(head -c 300 "$work/probe.body")" >&2; exit 1; }
    done
  done
}

# One script for every replica's wrk. SHAPE spread: a key drawn from KEYS (or, SPREAD=partition,
# replica REPLICA of REPLICAS walks its share); hot: hot0 .. hot<HOT_KEYS - 1>. TOKEN empty: a new
# token from the shared clock per request (µs × 4 + REPLICA); else that token on every request.
cat > "$work/load.lua" <<'LUA'
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } fg_timespec;
int clock_gettime(int clk, fg_timespec *ts);
]]
local ts = ffi.new("fg_timespec")
local hot = os.getenv("SHAPE") == "hot"
local keys = tonumber(hot and os.getenv("HOT_KEYS") or os.getenv("KEYS"))
local replica = tonumber(os.getenv("REPLICA"))
local replicas = tonumber(os.getenv("REPLICAS"))
local share = math.floor(keys / replicas)
local partition = not hot and os.getenv("SPREAD") == "partition"
local prefix = os.getenv("PREFIX") .. (hot and "hot" or "")
local fixed = os.getenv("TOKEN")
local n = 0
math.randomseed(os.time() * 7 + replica * 7919)
request = function()
  n = n + 1
  local key
  if partition then key = replica + replicas * (n % share) else key = math.random(0, keys - 1) end
  local token = fixed
  if token == "" then
    ffi.C.clock_gettime(0, ts) -- CLOCK_REALTIME: one clock for every wrk process
    token = string.format("%.0f", (tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)) * 4 + replica)
  end
  return wrk.format("POST", prefix .. key, { ["X-Fence"] = token }, "")
end
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
# The same for the process PID and its children, those that exited included (through PID's
# children-time fields, once it has reaped them): PostgreSQL's postmaster and its backends.
tree_ticks() {
  local pid=$1 total child
  [ -n "$pid" ] || { echo 0; return; }
  total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat" 2>/dev/null || echo 0)
  for child in $(pgrep -P "$pid" || true); do
    total=$(( total + $(awk '{print $14 + $15}' "/proc/$child/stat" 2>/dev/null || echo 0) ))
  done
  echo "$total"
}
# wrk's (this shell's reaped children's) and the nginx upstream's ticks.
harness_ticks() { echo $(( $(awk '{print $16 + $17}' "/proc/$$/stat") + $(tree_ticks "$(cat "$work/upstream.pid")") )); }
# Busy and total ticks of all cores.
machine_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
TICK_US=$(( 1000000 / $(getconf CLK_TCK) ))
NPROC=$(nproc)

# load BACKEND ORDERING SHAPE COUNT SECONDS: one wrk per replica 0 .. COUNT-1, at once; prints
# "accepted/s requests/s non2xx gateway_cpu_us store_cpu_us machine_busy_cores harness_cpu_us"
# (harness: wrk and the nginx upstream).
load() {
  local backend=$1 ordering=$2 shape=$3 count=$4 secs=$5
  local prefix=/serialized/ token="" r conns i=0
  [ "$ordering" = none ] && prefix=/unordered/
  [ "$shape" = hot ] && [ "$HOT_TOKENS" = same ] && token=$(clock_token)
  CPU_PIDS=""
  for r in $(seq 0 $((max_replicas - 1))); do CPU_PIDS+="${replica_pid[$backend-$r]} "; done
  local spid gw_before store_before machine_before gw_after store_after machine_after harness_before harness_after
  spid=$(store_pid "$backend")
  wrk_pids=()
  gw_before=$(cpu_ticks); store_before=$(tree_ticks "$spid"); machine_before=$(machine_ticks); harness_before=$(harness_ticks)
  for r in $(seq 0 $((count - 1))); do
    conns=$(( CONNS / count + (r < CONNS % count ? 1 : 0) ))
    SHAPE=$shape KEYS=$KEYS HOT_KEYS=$HOT_KEYS SPREAD=$SPREAD REPLICA=$r REPLICAS=$count PREFIX=$prefix TOKEN=$token \
      wrk -t1 -c"$conns" -d"${secs}s" --timeout 12s -s "$work/load.lua" "http://127.0.0.1:${data_port[$backend-$r]}$prefix" \
      >"$work/wrk-$r.out" 2>&1 &
    wrk_pids+=($!)
  done
  for r in "${wrk_pids[@]}"; do wait "$r" || i=1; done
  gw_after=$(cpu_ticks); store_after=$(tree_ticks "$spid"); machine_after=$(machine_ticks); harness_after=$(harness_ticks)
  wrk_pids=()
  [ "$i" = 0 ] || echo "scale-out.sh: a wrk failed ($backend $ordering $shape x$count): $(cat "$work"/wrk-*.out | tail -n 3)" >&2
  # Refused connections, failed handshakes and timeouts are no HTTP status: say so, not only non2xx.
  for r in $(seq 0 $((count - 1))); do
    grep 'Socket errors' "$work/wrk-$r.out" | sed "s|^ *|$backend-$r $ordering $shape x$count: |" >&2 || true
  done
  for r in $(seq 0 $((count - 1))); do
    awk '/Requests\/sec/ {rps = $2} /requests in/ {n = $1} /^non2xx/ {bad = $2} END {print rps + 0, n + 0, bad + 0}' "$work/wrk-$r.out"
  done | awk -v g=$(( (gw_after - gw_before) * TICK_US )) -v s=$(( (store_after - store_before) * TICK_US )) \
      -v mb="${machine_before% *}" -v mt="${machine_before#* }" -v nb="${machine_after% *}" -v nt="${machine_after#* }" \
      -v cores="$NPROC" -v havestore="${spid:+1}" -v h=$(( (harness_after - harness_before) * TICK_US )) '
    { if ($2 > 0) ok += $1 * ($2 - $3) / $2; rps += $1; n += $2; bad += $3 }
    END {
      busy = (nt > mt) ? cores * (nb - mb) / (nt - mt) : 0
      printf "%.0f %.0f %d %s %s %.2f %s\n", ok, rps, bad, (n > 0) ? sprintf("%.1f", g / n) : "-",
        (n > 0 && havestore) ? sprintf("%.1f", s / n) : "-", busy, (n > 0) ? sprintf("%.1f", h / n) : "-"
    }'
}

# refusals BACKEND: the replicas' own count of what they did not forward, by reason, over every
# run of the backend (warm-ups included), from their /metrics.
refusals() {
  local r
  for r in $(seq 0 $((max_replicas - 1))); do
    curl -fsS -m 5 "http://127.0.0.1:${admin_port[$1-$r]}/metrics" 2>/dev/null || true
  done | awk '
    /^fencegate_requests_total\{/ && /outcome="(refused|failed)"/ {
      match($0, /outcome="[a-z_]+"/); k = substr($0, RSTART + 9, RLENGTH - 10); o[k] += $NF }
    /^fencegate_fence_rejections_total\{/ {
      match($0, /reason="[a-z_]+"/); k = substr($0, RSTART + 8, RLENGTH - 9); why[k] += $NF }
    END {
      reasons = ""
      for (k in why) if (why[k] > 0) reasons = reasons sprintf("%s%s %d", reasons == "" ? "" : ", ", k, why[k])
      printf "refused %d%s, failed %d (no answer: the client left, the store or the key turn timed out, ...)\n",
        o["refused"], (reasons == "") ? "" : " (" reasons ")", o["failed"]
    }'
}

declare -A results refused
number=0
for backend in $backends; do
  echo "== $backend: starting $max_replicas replicas" >&2
  for r in $(seq 0 $((max_replicas - 1))); do start_replica "$backend" "$r" "$number"; done
  number=$((number + 1))
  probe "$backend"
  for round in $(seq 1 "$ROUNDS"); do
    for ordering in $ORDERINGS; do
      for shape in $SHAPES; do
        for count in $REPLICA_COUNTS; do
          # In this shell (not a command substitution), so that the trap knows the wrk processes.
          load "$backend" "$ordering" "$shape" "$count" 1 >/dev/null
          load "$backend" "$ordering" "$shape" "$count" "$SECS" >"$work/line"
          line=$(cat "$work/line")
          echo "round $round $backend $ordering $shape x$count: accepted/s req/s non2xx gw_us store_us busy_cores harness_us = $line" >&2
          key="$backend $ordering $shape $count"
          results[$key]+="$line"$'\n'
        done
      done
    done
  done
  refused[$backend]=$(refusals "$backend")
  for r in $(seq 0 $((max_replicas - 1))); do
    kill "${replica_pid[$backend-$r]}" 2>/dev/null || true
    wait "${replica_pid[$backend-$r]}" 2>/dev/null || true
    if [ -s "$work/$backend-$r.log" ]; then echo "$backend-$r logged:" >&2; tail -n 5 "$work/$backend-$r.log" >&2; fi
  done
done

# column KEY FIELD: the median of FIELD (1 accepted/s, 2 req/s, 4 gateway µs, 5 store µs, 6 busy
# cores, 7 wrk + nginx µs)
# over the rounds; 3 (non-2xx) is summed instead.
column() {
  local rows=${results[$1]:-}
  if [ "$2" = 3 ]; then awk 'NF {s += $3} END {print s + 0}' <<<"$rows"
  else awk -v f="$2" 'NF && $f != "-" {print $f}' <<<"$rows" | median
  fi
}
# cells KEY_PREFIX FIELD: the column's figures for every replica count, "a / b / c".
cells() {
  local out="" count v
  for count in $REPLICA_COUNTS; do
    v=$(column "$1 $count" "$2")
    out+="${out:+ / }${v:--}"
  done
  echo "$out"
}
store_name() { case $1 in postgres) echo "postgres (all processes)" ;; redis) echo redis-server ;; etcd) echo etcd ;; esac; }
shape_name() { case $1 in spread) echo "spread ($KEYS)" ;; hot) echo "$HOT_KEYS hot" ;; esac; }

echo "wrk -t1 per replica, c=$CONNS in all, ${SECS}s per run after a 1 s warm-up, median of $ROUNDS rounds (replica counts alternate within each round); $NPROC cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)) shared by the replicas, the store, wrk and the upstream"
echo
header="| backend | ordering | keys |"
rule="|---|---|---|"
for count in $REPLICA_COUNTS; do header+=" $count replica$([ "$count" = 1 ] || echo s) req/s |"; rule+="---|"; done
header+=" $last_count ÷ $first_count | non-2xx (all rounds, ${REPLICA_COUNTS// / \/ }) | gateways CPU µs/request | store CPU µs/request |"
rule+="---|---|---|---|"
echo "$header"
echo "$rule"
for backend in $backends; do
  for ordering in $ORDERINGS; do
    for shape in $SHAPES; do
      key="$backend $ordering $shape"
      row="| $backend | $ordering | $(shape_name "$shape") |"
      for count in $REPLICA_COUNTS; do row+=" $(column "$key $count" 1) |"; done
      ratio=$(awk -v a="$(column "$key $last_count" 1)" -v b="$(column "$key $first_count" 1)" \
        'BEGIN {if (b > 0) printf "%.2f", a / b; else printf "-"}')
      echo "$row $ratio | $(cells "$key" 3) | $(cells "$key" 4) | $(cells "$key" 5) |"
    done
  done
done
echo
echo "req/s: 2xx answers per second, summed over the replicas. CPU columns: per request answered, for"
echo "${REPLICA_COUNTS// / \/ } replicas; gateways: every started replica; store: $(for b in $backends; do printf '%s; ' "$(store_name "$b")"; done | sed 's/; $//')."
echo
echo "Reading (at $last_count replicas): cores = CPU µs/request × req/s; busy: the machine's busy cores (/proc/stat),"
echo "of which other = what neither the store, the gateways, wrk nor nginx used (other work running meanwhile)."
echo
for backend in $backends; do
  line=""
  for ordering in $ORDERINGS; do
    for shape in $SHAPES; do
      key="$backend $ordering $shape"
      line+="${line:+; }$ordering/$shape: $(awk -v rps="$(column "$key $last_count" 2)" -v g="$(column "$key $last_count" 4)" \
        -v s="$(column "$key $last_count" 5)" -v busy="$(column "$key $last_count" 6)" -v h="$(column "$key $last_count" 7)" \
        -v g1="$(column "$key $first_count" 4)" -v s1="$(column "$key $first_count" 5)" -v cores="$NPROC" \
        -v last="$(column "$key $last_count" 1)" -v first="$(column "$key $first_count" 1)" \
        -v label="$last_count ÷ $first_count" -v backend="$backend" '
        function c(us) { return (us == "" || us == "-") ? 0 : us * rps / 1000000 }
        BEGIN {
          sc = c(s); gc = c(g); hc = c(h); other = busy - sc - gc - hc; if (other < 0) other = 0
          big = "the gateways"; m = gc
          if (sc > m) { big = "the store"; m = sc }
          if (hc > m) { big = "wrk + nginx"; m = hc }
          if (other > m) { big = "other work"; m = other }
          if (backend == "redis" && sc >= 0.85) why = "store-bound (redis-server runs commands on one thread)"
          else if (busy >= 0.9 * cores) why = "machine-bound, most of it " big
          else why = "neither the store CPU nor the machine: waits (round trips, turns, fsync)"
          grow = ""
          if (g1 > 0 && g / g1 >= 1.5) grow = sprintf(", gateway CPU/request ×%.1f", g / g1)
          if (s1 > 0 && s / s1 >= 1.5) grow = grow sprintf(", store CPU/request ×%.1f", s / s1)
          printf "store %.2f + gateways %.2f + wrk/nginx %.2f + other %.2f = %.2f of %d cores; %s = %s%s → %s", sc, gc, hc,
            other, busy, cores, label, (first > 0) ? sprintf("%.2f", last / first) : "-", grow, why
        }')"
    done
  done
  echo "- **$backend**: $line."
done
echo
for backend in $backends; do
  echo "- $backend, not forwarded (the replicas' metrics, warm-ups included): ${refused[$backend]}"
done
