#!/usr/bin/env bash
# Resident memory of a gateway flooded with one million distinct resource keys: every request is
# an accepted fenced write to a key never seen before (serialize ordering, so each also passes the
# per-key gate), on the embedded store with the shipped cache capacity. Prints the resident set
# before, the peak (VmHWM) and after, and the documented ceiling it must stay under.
#
#   benches/flood.sh                 # KEYS (default 1000000), CONNS (default 64),
#                                    # CACHE_CAPACITY (default: the shipped 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
KEYS=${KEYS:-1000000}
CONNS=${CONNS:-64}
PORT=${PORT:-18190}
UPSTREAM_PORT=${UPSTREAM_PORT:-18191}
# The ceiling documented in docs/security.md for the default configuration.
CEILING_MIB=${CEILING_MIB:-256}

command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
command -v nginx >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nginx-light >/dev/null; }

work=$(mktemp -d)
gateway=""
cleanup() {
  [ -n "$gateway" ] && kill "$gateway" 2>/dev/null || true
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$UPSTREAM_PORT; location / { return 200 "ok"; } } }
NGINX
nginx -c "$work/nginx.conf"

mkdir -p "$work/state"
cat >"$work/flood.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
state_dir = "$work/state"
[store]
backend = "embedded"
path = "$work/fencegate.db"
cache_capacity = ${CACHE_CAPACITY:-100000}
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:$UPSTREAM_PORT"
resource_key = "invoice:{id}"
TOML
cargo build --release --locked --quiet --bin fencegate
RUST_LOG=error target/release/fencegate serve --config "$work/flood.toml" &
gateway=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

rss_mib() { awk -v f="$1" '$1 == f":" {printf "%.1f", $2 / 1024}' "/proc/$gateway/status"; }
before=$(rss_mib VmRSS)

# Request n (1..KEYS) writes key n with token KEYS + n; request KEYS also drops a marker file,
# and the run is stopped there. (wrk -t1: one script state shared by all connections.)
cat >"$work/flood.lua" <<'LUA'
local n = 0
local keys = tonumber(os.getenv("KEYS"))
local marker = os.getenv("MARKER")
request = function()
  n = n + 1
  if n == keys then
    local f = io.open(marker, "w")
    if f then f:write("done") f:close() end
  end
  local id = n <= keys and n or 1
  return wrk.format("POST", "/invoices/" .. id, { ["X-Fence"] = string.format("%d", keys + n) }, "")
end
done = function(summary) io.write(string.format("non2xx %d\n", summary.errors.status)) end
LUA
started=$(date +%s)
KEYS=$KEYS MARKER="$work/done" wrk -t1 -c"$CONNS" -d"${FLOOD_SECS:-900}s" -s "$work/flood.lua" \
  "http://127.0.0.1:$PORT/" >"$work/wrk.txt" &
wrk_pid=$!
while kill -0 "$wrk_pid" 2>/dev/null && [ ! -f "$work/done" ]; do sleep 1; done
kill -INT "$wrk_pid" 2>/dev/null || true
wait "$wrk_pid" 2>/dev/null || true
[ -f "$work/done" ] || { echo "flood: wrk ended before $KEYS keys were sent"; exit 1; }
elapsed=$(( $(date +%s) - started ))
after=$(rss_mib VmRSS)
peak=$(rss_mib VmHWM)
echo "flood: $KEYS distinct keys in ${elapsed}s, cache capacity ${CACHE_CAPACITY:-100000}; resident set before ${before} MiB, peak ${peak} MiB, after ${after} MiB (ceiling ${CEILING_MIB} MiB)"
awk -v p="$peak" -v c="$CEILING_MIB" 'BEGIN {exit !(p < c)}' && echo "flood: under the ceiling" || { echo "flood: OVER the ceiling"; exit 1; }
