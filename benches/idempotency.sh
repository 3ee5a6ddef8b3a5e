#!/usr/bin/env bash
# The extra latency of an idempotent write (intent recorded before the call, outcome after it)
# over a plain fenced write, per backend, side by side in one run: wrk -c1 (one request at a time,
# so p50 is the latency of one write), 5 s per path, paths alternating, median of 3 rounds.
#
#   benches/idempotency.sh              # ROUNDS, SECS, CONNS and BACKENDS as for fenced-writes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
backends=${BACKENDS:-"embedded postgres redis"}
paths=""
for backend in $backends; do paths+="fenced-$backend idem-$backend "; done
BACKENDS=$backends PATHS="$paths" CONNS=${CONNS:-1} SECS=${SECS:-5} ROUNDS=${ROUNDS:-3} exec benches/fenced-writes.sh
