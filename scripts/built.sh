# The workspace's test build, shared by the scripts that run its programs. Sourced by
# scripts/test.sh, scripts/check-release.sh and .ci/run.
#
#   TEST_FEATURES                 the features every test build uses (one set, so that each
#                                 cargo command of a CI run reuses what the last one built)
#   built_executable KIND NAME    builds the workspace's tests (nothing, when the test
#                                 command has just built them) and prints the path of the
#                                 program NAME of KIND (`bin`, `example` or `test`) that
#                                 build made
#
# A program built by `cargo build` or `cargo run` alone would be compiled again with its
# dependencies, whose features differ from the tests' (no dev-dependencies): minutes of a CI
# run each, for the same code.

TEST_FEATURES=sluice-limiter/cli,sluice-limiter/record-operations,sluice-examples/dynamodb,sluice-examples/demo,sluice-tower/http

built_executable() {
    local kind=$1 name=$2 path
    path=$(cargo test --locked --workspace --features "$TEST_FEATURES" --no-run \
        --message-format=json-render-diagnostics | python3 -c '
import json, sys
kind, name = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("name") == name \
            and kind in t.get("kind", []) and (kind == "test" or not m["profile"]["test"]) \
            and m.get("executable"):
        print(m["executable"])
' "$kind" "$name" | tail -n 1)
    if [ -z "$path" ] || [ ! -x "$path" ]; then
        echo "error: the test build made no $kind $name" >&2
        return 1
    fi
    echo "$path"
}
