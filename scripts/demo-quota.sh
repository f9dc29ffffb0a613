#!/usr/bin/env bash
# The shared-quota demo: N processes with skewed load share one simulated vendor key with no
# limiter, with a static split, and with sluice on a DynamoDB Local installed, started and
# stopped here. Writes docs/shared-quota.md (the table) and docs/shared-quota.svg (the
# chart). Arguments go to the demo, e.g. `--seconds 30 --processes 4`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh

cargo build --release -q -p sluice-examples --features demo --example shared_quota
trap dynamodb_local_stop EXIT
dynamodb_local_start
./target/release/examples/shared_quota --endpoint "$SLUICE_TEST_DYNAMODB_ENDPOINT" "$@"
