#!/usr/bin/env bash
# Runs the load generator against a fresh DynamoDB Local (installed and started here, stopped
# afterwards). Arguments go to the load generator, e.g. `--shapes 4x8 --seconds 10`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh

cargo build --release -q -p sluice-examples --features dynamodb --example loadgen
trap dynamodb_local_stop EXIT
dynamodb_local_start
./target/release/examples/loadgen --endpoint "$SLUICE_TEST_DYNAMODB_ENDPOINT" "$@"
