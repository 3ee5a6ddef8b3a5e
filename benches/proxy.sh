#!/usr/bin/env bash
# The proxy path against the proxy operators already run: the upstream directly, nginx
# proxy_pass (upstream keep-alive) and fencegate's passthrough route (mode = "off"), side by side
# in one run at c=128, paths alternating, median of 5 rounds of 10 s (ROUNDS, SECS, CONNS).
#
#   benches/proxy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BACKENDS=embedded PATHS="direct nginx passthrough" CONNS=${CONNS:-128} ROUNDS=${ROUNDS:-5} SECS=${SECS:-10} \
  exec benches/fenced-writes.sh
