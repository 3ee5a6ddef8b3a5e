#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests over real sockets (which start their
# own upstreams and gateways) and doc tests. Starts the local database services first, and ends
# with one line totalling every test binary's results.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
scripts/ensure-services.sh
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
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
