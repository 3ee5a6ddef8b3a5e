#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests over real sockets (which start their
# own upstreams and gateways) and doc tests. Starts the local database services first, and ends
# with one line totalling every test binary's results.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
scripts/ensure-services.sh
# The PostgreSQL tests open pools of their own (the three-replica history test about 35
# connections at once, beside the other test running with it); with fewer free connections they
# fail with "sorry, too many clients already" and name no cause. Measured peak of the whole
# suite: 35 client connections (pg_stat_activity sampled every 0.5 s through a full run on
# 2026-12-03, other clients included); 50 leaves room for what sampling misses.
needed="${FENCEGATE_TEST_PG_CONNECTIONS:-50}"
if command -v psql >/dev/null 2>&1; then
  if row=$(psql -h 127.0.0.1 -U postgres -d test -Atc "SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), current_setting('max_connections')" 2>&1); then
    free="${row%%|*}"; max="${row##*|}"
    if [ "$free" -lt "$needed" ]; then
      echo "postgres: only $free of max_connections = $max are free; the suite needs $needed."
      echo "  Close other clients, or raise max_connections (ALTER SYSTEM SET max_connections = 200; then restart PostgreSQL)."
      echo "  The PostgreSQL tests will fail with 'too many clients' otherwise; continuing so every other test still runs."
    else
      echo "postgres: $free of $max connections free (the suite needs $needed)"
    fi
  else
    echo "postgres: cannot count free connections: $row"
  fi
else
  echo "postgres: psql not found; free connections not checked (the suite needs $needed)"
fi
# The metrics test checks the exposition with Prometheus's own parser.
if ! command -v promtool >/dev/null 2>&1; then
  echo "installing promtool (Debian package prometheus)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
    || echo "promtool could not be installed; the metrics test will fail"
fi
# The differential tests run real upstream frameworks: nginx, Go, Flask and Express.
if ! tests/upstreams/install.sh; then
  echo "the differential tests' upstreams could not all be installed; those tests will fail"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
# The library as a service embeds it (Cargo.toml, [features]): the tower layer on the embedded
# store alone, without the PostgreSQL, Redis, etcd, ZooKeeper, OTLP, admin or command-line code. Its unit
# tests run there too: a configuration naming a part left out must be refused.
if [ "$#" = 0 ]; then
  cargo test --locked --no-fail-fast --lib --no-default-features --features embed 2>&1 \
    | tee -a "$log" || status=$?
fi
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
