#!/usr/bin/env bash
# Every row of the performance targets (issue 7) from one run on this machine, written to
# BENCHMARKS.md (replaced, not appended) with the date, the machine and the command.
#
#   benches/run.sh                  # ROUNDS (default 3) rounds of SECS (default 5) s per path
#   FENCEGATE_BIN=path OUT=file benches/run.sh   # another build (e.g. an older commit's), written to file
#   SCALE_OUT=1 benches/run.sh      # also the scale-out table (benches/scale-out.sh: about 11 minutes more)
#
# Each table below is one benches/fenced-writes.sh run: the paths of a table alternate within
# each round (A B A B) and every figure is the median of the rounds. Needs PostgreSQL, Redis and
# etcd (started by scripts/ensure-services.sh when installed); installs wrk, nginx-light and haproxy if
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export ROUNDS=${ROUNDS:-3} SECS=${SECS:-5}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -z "${FENCEGATE_BIN:-}" ]; then
  cargo build --release --locked --quiet --bin fencegate
  FENCEGATE_BIN=target/release/fencegate
fi
export FENCEGATE_BIN

# table NAME CONNS BACKENDS PATHS: one side-by-side run, its markdown kept in $work/NAME.md and its
# medians in $work/NAME.txt ("path req/s p50 p99 non2xx cpu_us").
table() {
  local name=$1 conns=$2 backends=$3 paths=$4
  echo "== $name: c=$conns, paths: $paths" >&2
  RESULTS="$work/$name.txt" CONNS=$conns BACKENDS=$backends PATHS=$paths \
    benches/fenced-writes.sh >"$work/$name.md"
}

table proxy 128 embedded "direct nginx haproxy passthrough nginx-logged logged-passthrough"
table tls 128 embedded "passthrough nginx passthrough-tls-listener nginx-tls-listener passthrough-tls-upstream nginx-tls-upstream passthrough-tls-both"
table stores 64 "embedded postgres redis etcd" \
  "passthrough fenced-embedded fenced-postgres spread-none-postgres fenced-redis fenced-etcd spread-none-etcd pgbench-upsert stale-embedded idem-embedded idem-postgres idem-redis idem-etcd"
table ordering 64 "embedded postgres redis" \
  "spread-serialize-embedded spread-none-embedded spread-serialize-postgres spread-none-postgres spread-serialize-redis spread-none-redis"
table latency 1 embedded "passthrough fenced-embedded"
table authority 64 embedded "passthrough held-plain held-watch held-strict"
# The default logging (info, a JSON access line per request, to a file) against RUST_LOG=error.
table logging 64 embedded "passthrough logged-passthrough fenced-embedded logged-fenced"
# 1, 2 and 3 gateway replicas sharing one store (benches/scale-out.sh): long, so only with SCALE_OUT=1.
if [ "${SCALE_OUT:-}" = 1 ]; then
  echo "== scale-out: 1, 2 and 3 replicas per store" >&2
  benches/scale-out.sh >"$work/scale-out.md"
fi

# User-space instructions per request beside nginx and HAProxy (callgrind; exact, so one run).
echo "== instructions per request (callgrind)" >&2
RUNS=1 benches/instructions.sh >"$work/instructions.md"

# One fsync on this disk (the embedded store's durability cost at c=1): 500 O_DSYNC 4 KiB writes
# in the directory the benchmarks keep their stores in.
fsync_us=$(dd if=/dev/zero of="$work/fsync.probe" bs=4k count=500 oflag=dsync 2>&1 |
  awk '/copied/ {for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) secs = $(i-1); print secs * 1000000 / 500}')
memory=$(cargo bench --locked --quiet --bench cache_memory 2>/dev/null | grep '^cache_memory:' || echo "cache_memory: not measured")

# field TABLE PATH COLUMN (2 = req/s, 3 = p50, 4 = p99, 5 = non-2xx, 6 = CPU µs/request)
field() { awk -v p="$2" -v c="$3" '$1 == p {print $c}' "$work/$1.txt"; }
# instructions PROCESS: its passthrough row in benches/instructions.sh's table.
instructions() { awk -F'|' -v p="$1 passthrough" '$2 ~ p {gsub(/ /, "", $3); print $3}' "$work/instructions.md"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}'; }
verdict() { awk -v v="$1" -v t="$2" -v dir="${3:-ge}" 'BEGIN {ok = (dir == "ge") ? v >= t : v <= t; print ok ? "holds" : "**misses**"}'; }

pass=$(field stores passthrough 2)
nginx=$(field proxy nginx 2)
proxy_pass=$(field proxy passthrough 2)
r_proxy=$(ratio "$proxy_pass" "$nginx")
haproxy=$(field proxy haproxy 2)
r_haproxy=$(ratio "$proxy_pass" "$haproxy")
p99_fg=$(field proxy passthrough 4)
p99_nginx=$(field proxy nginx 4)
r_p99=$(ratio "$p99_fg" "$p99_nginx")
r_logged_nginx=$(ratio "$(field proxy logged-passthrough 2)" "$(field proxy nginx-logged 2)")
r_embedded=$(ratio "$(field stores fenced-embedded 2)" "$pass")
r_postgres=$(ratio "$(field stores fenced-postgres 2)" "$pass")
r_pg_upsert=$(ratio "$(field stores fenced-postgres 2)" "$(field stores pgbench-upsert 2)")
r_postgres_none=$(ratio "$(field stores spread-none-postgres 2)" "$pass")
r_pg_upsert_none=$(ratio "$(field stores spread-none-postgres 2)" "$(field stores pgbench-upsert 2)")
r_redis=$(ratio "$(field stores fenced-redis 2)" "$pass")
etcd_serialize=$(field stores fenced-etcd 2)
etcd_none=$(field stores spread-none-etcd 2)
r_etcd_pg=$(ratio "$etcd_serialize" "$(field stores fenced-postgres 2)")
r_etcd_pg_none=$(ratio "$etcd_none" "$(field stores spread-none-postgres 2)")
r_watch=$(ratio "$(field authority held-watch 2)" "$(field authority held-plain 2)")
r_strict=$(ratio "$(field authority held-strict 2)" "$(field authority held-plain 2)")
r_stale=$(ratio "$(field stores stale-embedded 2)" "$pass")
idem=$(field stores idem-embedded 2)
r_idem=$(ratio "$idem" 10500)
r_idem_e=$(ratio "$idem" "$pass")
r_idem_p=$(ratio "$(field stores idem-postgres 2)" "$pass")
r_idem_r=$(ratio "$(field stores idem-redis 2)" "$pass")
r_idem_t=$(ratio "$(field stores idem-etcd 2)" "$pass")
r_logged_pass=$(ratio "$(field logging logged-passthrough 2)" "$(field logging passthrough 2)")
r_logged_fenced=$(ratio "$(field logging logged-fenced 2)" "$(field logging fenced-embedded 2)")
cpu_logged="$(field logging passthrough 6) → $(field logging logged-passthrough 6) µs; fenced $(field logging fenced-embedded 6) → $(field logging logged-fenced 6) µs"
r_order_e=$(ratio "$(field ordering spread-serialize-embedded 2)" "$(field ordering spread-none-embedded 2)")
r_order_p=$(ratio "$(field ordering spread-serialize-postgres 2)" "$(field ordering spread-none-postgres 2)")
r_order_r=$(ratio "$(field ordering spread-serialize-redis 2)" "$(field ordering spread-none-redis 2)")
cpu_fg=$(field proxy passthrough 6)
cpu_nginx=$(field proxy nginx 6)
cpu_haproxy=$(field proxy haproxy 6)
cpu_best=$(awk -v a="$cpu_nginx" -v b="$cpu_haproxy" 'BEGIN {print (a + 0 < b + 0) ? a : b}')
r_etcd_pass=$(ratio "$etcd_serialize" "$pass")
lat_pass=$(field latency passthrough 3)
lat_fenced=$(field latency fenced-embedded 3)
lat_extra=$(awk -v a="$lat_fenced" -v b="$lat_pass" 'BEGIN {printf "%.0f", a - b}')
lat_budget=$(awk -v f="$fsync_us" 'BEGIN {printf "%.0f", f + 100}')
bytes_per_key=$(sed -n 's/.*: \([0-9]*\) bytes per key/\1/p' <<<"$memory")
bytes_per_key=${bytes_per_key:-0}
mib_million=$(awk -v b="$bytes_per_key" 'BEGIN {printf "%.0f", b * 1000000 / 1048576}')

{
  echo "# Benchmarks"
  echo
  echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)),"
  echo "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, by \`benches/run.sh\` (ROUNDS=$ROUNDS, SECS=$SECS), commit $(git rev-parse --short HEAD), binary \`$FENCEGATE_BIN\`."
  echo "Load: wrk -t1 on loopback; upstream: nginx \`return 200\` (keep-alive); every figure is the median of"
  echo "$ROUNDS rounds in which the paths of one table alternate. The machine is a shared VM: compare the"
  echo "ratios (measured side by side), not the absolute figures, with other runs."
  echo
  echo "## Targets"
  echo
  echo "| target | measured | verdict |"
  echo "|---|---|---|"
  echo "| passthrough c=128 ≥ 1.1× nginx proxy_pass | $proxy_pass vs $nginx req/s = ${r_proxy}× | $(verdict "$r_proxy" 1.1) |"
  echo "| passthrough c=128 ≥ 1.1× HAProxy (\`http-reuse always\`, $(nproc) threads) | $proxy_pass vs $haproxy req/s = ${r_haproxy}× | $(verdict "$r_haproxy" 1.1) |"
  echo "| CPU per passthrough request ≤ the best peer's: fencegate / nginx / HAProxy | $cpu_fg / $cpu_nginx / $cpu_haproxy µs | $(verdict "$cpu_fg" "$cpu_best" le) |"
  echo "| user-space instructions per passthrough request (callgrind, one serving thread): fencegate / nginx / HAProxy | $(instructions fencegate) / $(instructions nginx) / $(instructions haproxy) | - |"
  echo "| passthrough p99 ≤ nginx's | $p99_fg µs vs $p99_nginx µs = ${r_p99}× | $(verdict "$p99_fg" "$p99_nginx" le) |"
  echo "| access logs on both sides (fencegate's JSON line, nginx's combined line, each to a file) ≥ 1.1× nginx | ${r_logged_nginx}× | $(verdict "$r_logged_nginx" 1.1) |"
  echo "| fenced writes, embedded (durable, every token a new advance) ≥ 0.7× passthrough | ${r_embedded}× | $(verdict "$r_embedded" 0.7) |"
  echo "| fenced writes, PostgreSQL (default \`ordering = \"serialize\"\`) ≥ 0.5× passthrough | ${r_postgres}× | $(verdict "$r_postgres" 0.5) |"
  echo "| the same with \`ordering = \"none\"\` | ${r_postgres_none}× | $(verdict "$r_postgres_none" 0.5) |"
  echo "| fenced writes, PostgreSQL ≥ 2.5× one INSERT … ON CONFLICT per request (pgbench, ${PGBENCH_CLIENTS:-16} clients): serialize; none | ${r_pg_upsert}×; ${r_pg_upsert_none}× | $(verdict "$r_pg_upsert" 2.5); $(verdict "$r_pg_upsert_none" 2.5) |"
  echo "| fenced writes, Redis ≥ 0.7× passthrough | ${r_redis}× | $(verdict "$r_redis" 0.7) |"
  echo "| fenced writes, etcd, next to PostgreSQL: serialize; none | $etcd_serialize req/s = ${r_etcd_pg}×; $etcd_none req/s = ${r_etcd_pg_none}× | - |"
  echo "| fenced writes, etcd, serialized ≥ 0.3× passthrough | ${r_etcd_pass}× | $(verdict "$r_etcd_pass" 0.3) |"
  echo "| lock authority watch / no authority, holders' writes (cost of following etcd) | ${r_watch} | - |"
  echo "| lock authority \`strict\` / no authority (a linearizable etcd read per batch of writes) | ${r_strict} | - |"
  echo "| stale writes refused from the cache ≥ 2× passthrough | ${r_stale}× | $(verdict "$r_stale" 2) |"
  echo "| idempotent writes, unique keys, embedded ≥ 3× 10.5k req/s | $idem req/s = ${r_idem}× | $(verdict "$r_idem" 3) |"
  echo "| idempotent writes, unique keys, ≥ 0.6× passthrough: embedded; PostgreSQL; Redis; etcd | ${r_idem_e}×; ${r_idem_p}×; ${r_idem_r}×; ${r_idem_t}× | $(verdict "$r_idem_e" 0.6); $(verdict "$r_idem_p" 0.6); $(verdict "$r_idem_r" 0.6); $(verdict "$r_idem_t" 0.6) |"
  echo "| default access log (info, JSON to a file) / RUST_LOG=error: passthrough; fenced, embedded (CPU µs/request) | ${r_logged_pass}; ${r_logged_fenced} ($cpu_logged) | - |"
  echo "| serialize / none on 10,000 keys, embedded ≥ 0.9 | ${r_order_e} | $(verdict "$r_order_e" 0.9) |"
  echo "| serialize / none on 10,000 keys, PostgreSQL ≥ 0.9 | ${r_order_p} | $(verdict "$r_order_p" 0.9) |"
  echo "| serialize / none on 10,000 keys, Redis (turns leased in Redis) | ${r_order_r} | - |"
  echo "| c=1 fenced write (embedded) ≤ one fsync + 100 µs over passthrough | +$lat_extra µs (p50), budget $lat_budget µs (fsync $(printf '%.0f' "$fsync_us") µs) | $(verdict "$lat_extra" "$lat_budget" le) |"
  echo "| memory per cached key ≤ 200 bytes; 1M keys < 256 MiB | $bytes_per_key bytes per key, ≈ $mib_million MiB per million | $(verdict "$bytes_per_key" 200 le) |"
  echo
  echo "## Proxy path (c=128)"
  echo
  echo "\`nginx\`: nginx proxy_pass with upstream keep-alive, one worker per core; \`haproxy\`: HAProxy with"
  echo "\`http-reuse always\` and one thread per core; neither logs. \`nginx-logged\`: the same nginx writing"
  echo "its default (combined) access line per request to a file; \`logged-passthrough\`: fencegate at"
  echo "\`RUST_LOG=info\` writing its JSON access line per request to a file."
  cat "$work/proxy.md"
  echo
  echo "## Instructions per request"
  echo
  echo "\`benches/instructions.sh\` (this VM has no hardware counters; callgrind counts exactly):"
  cat "$work/instructions.md"
  echo
  echo "## TLS (c=128)"
  echo
  echo "\`-tls-listener\`: TLS from wrk to the proxy, plain to the upstream; \`-tls-upstream\`: plain from wrk,"
  echo "TLS to the same nginx \`return 200\` listening with ssl (HTTP/1.1, kept alive; both proxies verify its"
  echo "certificate against one throw-away CA and the name localhost); \`-tls-both\`: both legs. One EC P-256"
  echo "certificate throughout (benches/tls.sh); nginx is allowed TLS 1.2 and 1.3, as fencegate is. wrk keeps"
  echo "its connections, so a run has few handshakes. wrk's own TLS work on the listener paths shares the"
  echo "cores; CPU µs/request counts the proxy's processes only."
  cat "$work/tls.md"
  echo
  benches/tls-ratios.sh "$work/tls.txt"
  echo
  echo "## Stores (c=64)"
  echo
  echo "\`pgbench-upsert\` is pgbench with ${PGBENCH_CLIENTS:-16} clients running one \`INSERT … ON CONFLICT … DO UPDATE … WHERE\`"
  echo "per transaction against the same PostgreSQL (no HTTP): its req/s column is transactions/s and its p50"
  echo "column pgbench's average latency. \`stale-embedded\` requests all get 409 from the cache (counted as non-2xx)."
  cat "$work/stores.md"
  echo
  echo "## Ordering (c=64, 10,000 keys)"
  cat "$work/ordering.md"
  if [ -f "$work/scale-out.md" ]; then
    echo
    echo "## Scale-out (1, 2 and 3 replicas sharing one store, c=64)"
    echo
    cat "$work/scale-out.md"
  fi
  echo
  echo "## Lock authority (c=64)"
  echo
  echo "64 etcd locks held (etcd's recipe: a key under a lease, the create revision is the token); every request"
  echo "is a holder's write with its own token, through a gateway on the embedded store whose routes differ only"
  echo "in \`[routes.fence.authority]\`: none (\`held-plain\`), the watch (\`held-watch\`), and"
  echo "\`require_live_lease\` + \`strict\` (\`held-strict\`: each write's holder confirmed by a linearizable read,"
  echo "batched)."
  cat "$work/authority.md"
  echo
  echo "## Access log (c=64)"
  echo
  echo "\`logged-*\`: the same gateway configuration logging as it does by default (\`RUST_LOG=info\`,"
  echo "\`--log-format json\`, a line per request written to a file), beside the others at \`RUST_LOG=error\`."
  cat "$work/logging.md"
  echo
  echo "## Latency at c=1"
  cat "$work/latency.md"
  echo
  echo "One fsync (O_DSYNC 4 KiB write, same disk): $(printf '%.0f' "$fsync_us") µs."
  echo
  echo "## Memory"
  echo
  echo "\`cargo bench --bench cache_memory\`: $memory"
  echo
  cat benches/profile-notes.md
} >"${OUT:-BENCHMARKS.md}"
echo "${OUT:-BENCHMARKS.md} written" >&2
sed -n '/## Targets/,/## Proxy/p' BENCHMARKS.md
