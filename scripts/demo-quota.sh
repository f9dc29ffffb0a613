#!/usr/bin/env bash
# The shared-quota demo: N processes with skewed load share one simulated vendor key with no
# limiter, with a static split, and with sluice on a DynamoDB Local installed, started and
# stopped here. Writes docs/shared-quota.md (the table) and docs/shared-quota.svg (the
# chart). Arguments go to the demo, e.g. `--seconds 30 --processes 4`.
#
# With `--behind-fidelity WU` first, the table sits behind dynamodb-fidelity (started and
# stopped here too) with a per-item ceiling of WU write units a second (and three times
# that in read units), as a fleet's table meets real DynamoDB's: e.g.
# `./scripts/demo-quota.sh --behind-fidelity 100 --processes 48 --modes sluice --seconds 60
# --chart /tmp/quota.svg --table-out /tmp/quota.md`. The proxy's count of every row's calls,
# throttles and failed conditional writes over the whole run is then written to
# target/demo-quota-fidelity-stats.json. `--log` (with the demo's arguments) writes every
# worker's limiter decisions and DynamoDB call durations to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh
source scripts/dynamodb-fidelity.sh

ceiling=""
if [ "${1:-}" = "--behind-fidelity" ]; then
    ceiling="${2:?--behind-fidelity takes write units a second}"
    shift 2
fi
cargo build --release -q -p sluice-examples --features demo --example shared_quota
trap 'dynamodb_fidelity_stop; dynamodb_local_stop' EXIT
dynamodb_local_start
endpoint="$SLUICE_TEST_DYNAMODB_ENDPOINT"
if [ -n "$ceiling" ]; then
    cargo build --release -q -p dynamodb-fidelity
    reads=$(python3 -c "print(3 * float('$ceiling'))")
    DYNAMODB_FIDELITY_BIN=./target/release/dynamodb-fidelity \
        dynamodb_fidelity_start --write-ceiling "$ceiling" --read-ceiling "$reads"
    endpoint="$DYNAMODB_FIDELITY_ENDPOINT"
fi
./target/release/examples/shared_quota --endpoint "$endpoint" "$@"
if [ -n "$ceiling" ]; then
    if python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
        "$DYNAMODB_FIDELITY_ENDPOINT/_fidelity/stats" >target/demo-quota-fidelity-stats.json; then
        echo "wrote target/demo-quota-fidelity-stats.json" >&2
    else
        echo "could not read dynamodb-fidelity's stats" >&2
    fi
fi
