#!/usr/bin/env bash
# ordering = "serialize" against ordering = "none": accepted fenced writes per second on one hot
# key and on 10,000 keys, on the embedded store (in-process gate) and on PostgreSQL (in-process
# plus cross-replica advisory-lock gate), all in one run with the paths alternating.
#
#   benches/ordering.sh                 # 3 rounds of 10 s per path, c=64 (ROUNDS, SECS, CONNS)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=""
for backend in ${BACKENDS:-embedded postgres}; do
  for shape in hot spread; do
    paths+="$shape-serialize-$backend $shape-none-$backend "
  done
done
BACKENDS=${BACKENDS:-"embedded postgres"} PATHS="passthrough $paths" ROUNDS=${ROUNDS:-3} exec benches/fenced-writes.sh
