#!/usr/bin/env bash
# Runs the load generator against a fresh DynamoDB Local (installed and started here) and a
# dynamodb-fidelity proxy in front of it (real DynamoDB's per-item ceilings, billing,
# throttling and transaction conflicts), both stopped by PID afterwards. Arguments go to the
# load generator, e.g. `--only fanout` or `--shapes 4x8 --seconds 10`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh
source scripts/dynamodb-fidelity.sh

cargo build --release -q -p sluice-examples --features dynamodb --example loadgen
cargo build --release -q -p dynamodb-fidelity
stop() {
    dynamodb_fidelity_stop
    dynamodb_local_stop
}
trap stop EXIT
dynamodb_local_start
DYNAMODB_FIDELITY_BIN=./target/release/dynamodb-fidelity dynamodb_fidelity_start
./target/release/examples/loadgen --endpoint "$SLUICE_TEST_DYNAMODB_ENDPOINT" \
    --fidelity "$DYNAMODB_FIDELITY_ENDPOINT" "$@"
