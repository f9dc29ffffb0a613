# Functions to start and stop a dynamodb-fidelity proxy (this workspace's crate) in front of
# the DynamoDB Local that scripts/dynamodb-local.sh started. Sourced by scripts/test.sh and
# scripts/loadgen.sh, after dynamodb_local_start.
#
#   dynamodb_fidelity_start [FLAGS...]  starts the proxy (DYNAMODB_FIDELITY_BIN, else the
#                                       debug build) on a free loopback port in front of
#                                       $SLUICE_TEST_DYNAMODB_ENDPOINT, with FLAGS (ceilings,
#                                       transaction hold); exports DYNAMODB_FIDELITY_ENDPOINT.
#   dynamodb_fidelity_stop              stops it by PID.

DYNAMODB_FIDELITY_PID=""

dynamodb_fidelity_start() {
    local bin="${DYNAMODB_FIDELITY_BIN:-${CARGO_TARGET_DIR:-target}/debug/dynamodb-fidelity}"
    [ -x "$bin" ] || { echo "error: dynamodb-fidelity: $bin is not built" >&2; exit 1; }
    [ -n "${SLUICE_TEST_DYNAMODB_ENDPOINT:-}" ] || { echo "error: dynamodb-fidelity: start DynamoDB Local first" >&2; exit 1; }
    local address
    address=$(mktemp -u "${TMPDIR:-/tmp}/dynamodb-fidelity.XXXXXX")
    "$bin" --upstream "$SLUICE_TEST_DYNAMODB_ENDPOINT" --address-file "$address" \
        --ignore-stdin "$@" </dev/null >/dev/null &
    DYNAMODB_FIDELITY_PID=$!
    local deadline=$((SECONDS + 30))
    until [ -s "$address" ]; do
        if ! kill -0 "$DYNAMODB_FIDELITY_PID" 2>/dev/null; then
            echo "error: dynamodb-fidelity exited before listening" >&2
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            dynamodb_fidelity_stop
            echo "error: dynamodb-fidelity did not listen within 30 s" >&2
            exit 1
        fi
        sleep 0.1
    done
    DYNAMODB_FIDELITY_ENDPOINT=$(cat "$address")
    rm -f "$address"
    export DYNAMODB_FIDELITY_ENDPOINT
    echo "dynamodb-fidelity is up on $DYNAMODB_FIDELITY_ENDPOINT (pid $DYNAMODB_FIDELITY_PID) in front of $SLUICE_TEST_DYNAMODB_ENDPOINT" >&2
}

dynamodb_fidelity_stop() {
    if [ -n "$DYNAMODB_FIDELITY_PID" ] && kill -0 "$DYNAMODB_FIDELITY_PID" 2>/dev/null; then
        kill "$DYNAMODB_FIDELITY_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$DYNAMODB_FIDELITY_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$DYNAMODB_FIDELITY_PID" 2>/dev/null || true
        wait "$DYNAMODB_FIDELITY_PID" 2>/dev/null || true
    fi
    DYNAMODB_FIDELITY_PID=""
}
