#!/usr/bin/env bash
# Accepted fenced writes per second on the embedded store, side by side with the same gateway's
# passthrough route (mode = "off") and the upstream called directly, in one run.
#
#   benches/fenced-writes.sh            # 5 rounds of 10 s per path, c=64 (ROUNDS, SECS, CONNS, KEYS)
#
# Every fenced request carries a new, larger token for its key (a real durable advance, not a
# repeat of a known token): request n writes key n % KEYS with token BASE + n. The upstream is
# nginx answering `return 200` with keep-alive (installed from Debian if missing); load is wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

ROUNDS=${ROUNDS:-5}
SECS=${SECS:-10}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
UPSTREAM_PORT=${UPSTREAM_PORT:-19000}
GATEWAY_PORT=${GATEWAY_PORT:-18080}

need() { command -v "$1" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }
need wrk wrk
need nginx nginx-light

work=$(mktemp -d)
cleanup() {
  [ -n "${gateway_pid:-}" ] && kill "$gateway_pid" 2>/dev/null || true
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
  server {
    listen 127.0.0.1:$UPSTREAM_PORT;
    location / { return 200 "ok"; }
  }
}
NGINX
nginx -c "$work/nginx.conf"

cat > "$work/fencegate.toml" <<TOML
[server]
listen = "127.0.0.1:$GATEWAY_PORT"
[store]
backend = "embedded"
path = "$work/fencegate.db"
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
[[routes]]
name = "plain"
path = "/plain/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
[routes.fence]
mode = "off"
TOML

cargo build --release --locked --quiet --bin fencegate
RUST_LOG=warn target/release/fencegate serve --config "$work/fencegate.toml" &
gateway_pid=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$GATEWAY_PORT") 2>/dev/null && break; sleep 0.1; done

cat > "$work/advance.lua" <<'LUA'
local n = 0
local keys = tonumber(os.getenv("KEYS"))
local base = tonumber(os.getenv("BASE"))
request = function()
  n = n + 1
  return wrk.format("POST", "/invoices/" .. (n % keys), { ["X-Fence"] = string.format("%.0f", base + n) }, "")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
cat > "$work/plain.lua" <<'LUA'
local n = 0
request = function() n = n + 1; return wrk.format("POST", "/plain/" .. (n % 10000), {}, "") end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA

# wrk prints latencies as 850.00us, 1.20ms or 1.01s; convert to microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v+0} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1000000}}'; }

# One wrk run; prints "req/s p50_us p99_us non2xx".
run() {
  local url=$1 script=$2
  local out
  out=$(BASE=$(( $(date +%s%N) / 1000 )) KEYS=$KEYS wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$script" "$url")
  local rps p50 p99 bad
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out" | to_us)
  p99=$(awk '$1=="99%" {print $2}' <<<"$out" | to_us)
  bad=$(awk '/^non2xx/ {print $2}' <<<"$out")
  echo "$rps $p50 $p99 $bad"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A results
for round in $(seq 1 "$ROUNDS"); do
  for path in direct passthrough fenced; do
    case $path in
      direct) line=$(run "http://127.0.0.1:$UPSTREAM_PORT/plain/1" "$work/plain.lua") ;;
      passthrough) line=$(run "http://127.0.0.1:$GATEWAY_PORT/plain/1" "$work/plain.lua") ;;
      fenced) line=$(run "http://127.0.0.1:$GATEWAY_PORT/invoices/1" "$work/advance.lua") ;;
    esac
    echo "round $round $path: req/s p50_us p99_us non2xx = $line" >&2
    results[$path]+="$line"$'\n'
  done
done

echo
echo "wrk -t1 -c$CONNS, ${SECS}s per run, median of $ROUNDS rounds (paths alternate within each round)"
echo
echo "| path | req/s | p50 (µs) | p99 (µs) | non-2xx (all runs) |"
echo "|---|---|---|---|---|"
for path in direct passthrough fenced; do
  rows=${results[$path]}
  rps=$(awk 'NF {print $1}' <<<"$rows" | median)
  p50=$(awk 'NF {print $2}' <<<"$rows" | median)
  p99=$(awk 'NF {print $3}' <<<"$rows" | median)
  bad=$(awk 'NF {s+=$4} END {print s+0}' <<<"$rows")
  echo "| $path | $rps | $p50 | $p99 | $bad |"
done
