#!/usr/bin/env bash
# Legitimate requests' latency while each attack of issue 18 runs, side by side with the same load
# and no attack, in one run. One gateway (release build, embedded store) with the ceilings in the
# configuration below; the legitimate load is wrk (-t1, CONNS connections) writing fenced,
# serialized keys (a new, larger token per request, 10,000 keys) through the gateway to nginx;
# each attack comes from examples/attacker.rs, which opens again whatever the gateway closes, so
# the attack lasts the whole run. Rounds alternate "none" with each attack; figures are medians.
#
#   benches/attacks.sh                       # ROUNDS (3) rounds of SECS (5) s, CONNS (16)
#   ATTACKS="silent h2-idle" benches/attacks.sh
#   FENCEGATE_BIN=path benches/attacks.sh    # another build
#
# Prints a markdown table: per attack, the legitimate load's req/s, p50, p99, non-2xx answers and
# socket errors, the p99 against "none" in the same round, and the gateway's CPU per legitimate
# request (the attack's own work included: that is what the attack costs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
CONNS=${CONNS:-16}
ATTACKS=${ATTACKS:-"silent h2-idle h2-streams h2-bodies zero-window unread admin"}
GATEWAY_PORT=${GATEWAY_PORT:-18300}
ADMIN_PORT=${ADMIN_PORT:-18301}
UPSTREAM_PORT=${UPSTREAM_PORT:-18302}
SLOW_PORT=${SLOW_PORT:-18303}
BIG_PORT=${BIG_PORT:-18304}
ADMIN_TOKEN=attack-bench-admin-token

# The ceilings under test (also printed with the results).
MAX_CONNECTIONS=1000
ADMIN_MAX_CONNECTIONS=32
MAX_UPSTREAM_CONNECTIONS=64
MAX_BUFFERED="64MiB"

# shellcheck source=benches/common.sh
source benches/common.sh
need wrk wrk
need nginx nginx-light

cargo build --release --locked --quiet --example attacker
ATTACKER=target/release/examples/attacker
if [ -z "${FENCEGATE_BIN:-}" ]; then
  cargo build --release --locked --quiet --bin fencegate
  FENCEGATE_BIN=target/release/fencegate
fi

work=$(mktemp -d)
pids=()
attack_pid=""
cleanup() {
  [ -n "$attack_pid" ] && kill "$attack_pid" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UPSTREAM_PORT; location / { return 200 "ok"; } }
}
NGINX
nginx -c "$work/nginx.conf"
# The upstreams the attacks need: one that answers after a second (streams and bodies pile up),
# one that answers 8 MiB at once (a client that does not read it).
"$ATTACKER" upstream "$SLOW_PORT" 1000 64 & pids+=($!)
"$ATTACKER" upstream "$BIG_PORT" 0 $((8 * 1024 * 1024)) & pids+=($!)

mkdir -p "$work/state"
cat > "$work/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$GATEWAY_PORT"
state_dir = "$work/state"
max_connections = $MAX_CONNECTIONS
max_upstream_connections = $MAX_UPSTREAM_CONNECTIONS
max_buffered_bytes = "$MAX_BUFFERED"
[admin]
listen = "127.0.0.1:$ADMIN_PORT"
token = "$ADMIN_TOKEN"
max_connections = $ADMIN_MAX_CONNECTIONS
[store]
backend = "embedded"
path = "$work/fencegate.db"
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[[routes]]
name = "slow"
path = "/slow/{id}"
upstream = "http://127.0.0.1:$SLOW_PORT"
[routes.fence]
mode = "off"
[[routes]]
name = "payouts"
path = "/payouts/{id}"
upstream = "http://127.0.0.1:$SLOW_PORT"
resource_key = "payout:{id}"
[routes.idempotency]
key = "payout:{id}"
[[routes]]
name = "big"
path = "/big/{id}"
upstream = "http://127.0.0.1:$BIG_PORT"
resource_key = "big:{id}"
TOML
RUST_LOG=error "$FENCEGATE_BIN" serve --config "$work/gateway.toml" & gateway=$!
pids+=($gateway)
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$GATEWAY_PORT") 2>/dev/null && break; sleep 0.1; done
sleep 0.2
kill -0 "$gateway" 2>/dev/null || { echo "attacks.sh: the gateway did not start" >&2; exit 1; }

gw=127.0.0.1:$GATEWAY_PORT
# Each attack: what the attacker binary is told, and how the table describes it.
declare -A attack_args attack_text
attack_args[silent]="silent $gw 500";                        attack_text[silent]="500 connections that never send a byte"
attack_args[h2-idle]="h2-idle $gw 500";                      attack_text[h2-idle]="500 HTTP/2 connections with no stream"
attack_args[h2-streams]="h2-streams $gw 4 200 /slow/x";      attack_text[h2-streams]="4 HTTP/2 connections x 200 streams to a 1 s upstream"
attack_args[h2-bodies]="h2-bodies $gw 4 200 1048576 /payouts/x"; attack_text[h2-bodies]="4 HTTP/2 connections x 200 streams x 1 MiB to an idempotent route"
attack_args[zero-window]="zero-window $gw 50 /big/x";        attack_text[zero-window]="50 HTTP/2 zero-window readers of 8 MiB serialized answers"
attack_args[unread]="unread $gw 50 /big/x";                  attack_text[unread]="50 HTTP/1.1 clients leaving 8 MiB serialized answers unread"
attack_args[admin]="silent 127.0.0.1:$ADMIN_PORT 1100";      attack_text[admin]="1,100 idle admin connections"

cat > "$work/advance.lua" <<'LUA'
local n = 0
local base = tonumber(os.getenv("BASE"))
request = function()
  n = n + 1
  return wrk.format("POST", "/invoices/" .. (n % 10000), { ["X-Fence"] = string.format("%.0f", base + n) }, "")
end
done = function(summary)
  local e = summary.errors
  io.write(string.format("non2xx %d\nsocket %d\n", e.status, e.connect + e.read + e.write + e.timeout))
end
LUA

cpu_ticks() { awk '{print $14 + $15}' "/proc/$gateway/stat"; }
TICK_US=$(( 1000000 / $(getconf CLK_TCK) ))

# One legitimate run: "req/s p50_us p99_us non2xx socket_errors cpu_us_per_request".
run() {
  local out before after requests
  before=$(cpu_ticks)
  out=$(BASE=$(( $(date +%s%N) / 1000 )) wrk -t1 -c"$CONNS" -d"${SECS}s" --timeout 10s --latency \
    -s "$work/advance.lua" "http://$gw/invoices/1")
  after=$(cpu_ticks)
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  echo "$(awk '/Requests\/sec/ {print $2}' <<<"$out") \
$(awk '$1=="50%" {print $2}' <<<"$out" | to_us) \
$(awk '$1=="99%" {print $2}' <<<"$out" | to_us) \
$(awk '/^non2xx/ {print $2}' <<<"$out") \
$(awk '/^socket/ {print $2}' <<<"$out") \
$(awk -v t=$(( (after - before) * TICK_US )) -v n="${requests:-0}" 'BEGIN {if (n > 0) printf "%.1f", t / n; else print "-"}')"
}

# Runs the legitimate load under `attack` (none: alone); the attack starts a second before.
measure() {
  local attack=$1
  if [ "$attack" != none ]; then
    # shellcheck disable=SC2086
    "$ATTACKER" ${attack_args[$attack]} >/dev/null 2>&1 & attack_pid=$!
    sleep 1
  fi
  run
  if [ -n "$attack_pid" ]; then
    kill "$attack_pid" 2>/dev/null || true
    wait "$attack_pid" 2>/dev/null || true
    attack_pid=""
    # Lets the gateway close what the attack left (its first-byte and idle timeouts are 10 s and
    # 60 s: the attacker's own exit closes its sockets at once).
    sleep 1
  fi
  kill -0 "$gateway" 2>/dev/null || { echo "attacks.sh: the gateway died under $attack" >&2; exit 1; }
}

declare -A results
for round in $(seq 1 "$ROUNDS"); do
  for attack in $ATTACKS; do
    echo "== round $round: none, then $attack" >&2
    # Not in a command substitution: the attacker's pid must stay known to this shell.
    measure none >"$work/base"
    measure "$attack" >"$work/under"
    base=$(cat "$work/base")
    under=$(cat "$work/under")
    results[$attack]+="$under $(awk -v a="$(cut -d' ' -f3 <<<"$under")" -v b="$(cut -d' ' -f3 <<<"$base")" 'BEGIN {printf "%.2f", a / b}')"$'\n'
    results[none]+="$base"$'\n'
  done
done

column_median() { awk -v c="$2" 'NF {print $c}' <<<"${results[$1]}" | median; }
echo "Legitimate load: wrk -t1 -c$CONNS, ${SECS} s per run, fenced serialized writes (embedded store) to nginx; median of $ROUNDS rounds, each attack measured right after a run without one."
echo "Ceilings: max_connections $MAX_CONNECTIONS, [admin] max_connections $ADMIN_MAX_CONNECTIONS, max_upstream_connections $MAX_UPSTREAM_CONNECTIONS per upstream, max_buffered_bytes $MAX_BUFFERED, max_concurrent_streams 100 and the connection timeouts at their defaults; open-file limit $(awk '/Max open files/ {print $4}' "/proc/$gateway/limits"); gateway peak resident $(awk '/VmHWM/ {print $2, $3}' "/proc/$gateway/status")."
echo
echo "| attack | req/s | p50 | p99 | p99 ÷ none (same round) | non-2xx | socket errors | CPU µs/request |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
printf '| none | %s | %s µs | %s µs | 1.00 | %s | %s | %s |\n' \
  "$(column_median none 1)" "$(column_median none 2)" "$(column_median none 3)" \
  "$(column_median none 4)" "$(column_median none 5)" "$(column_median none 6)"
for attack in $ATTACKS; do
  printf '| %s | %s | %s µs | %s µs | %s | %s | %s | %s |\n' "${attack_text[$attack]}" \
    "$(column_median "$attack" 1)" "$(column_median "$attack" 2)" "$(column_median "$attack" 3)" \
    "$(column_median "$attack" 7)" "$(column_median "$attack" 4)" "$(column_median "$attack" 5)" \
    "$(column_median "$attack" 6)"
done
