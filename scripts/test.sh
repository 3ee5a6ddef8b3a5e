#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests over real sockets (which start their
# own upstreams and gateways) and doc tests. Starts the local database services first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
scripts/ensure-services.sh
cargo test --locked "$@"
