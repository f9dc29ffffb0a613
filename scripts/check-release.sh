#!/usr/bin/env bash
# What a release needs beyond the tests: the API docs as docs.rs builds them (feature-gated
# items marked), packages crates.io accepts (`cargo publish --workspace --dry-run`) whose
# packaged sources build, and the reconciler's Lambda function built
# and zipped as deploy/README.md says.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

# Packages crates.io accepts; then their packaged sources, built. `--dry-run` alone builds
# each package from them one at a time, each resolving features of its own, which compiled
# the AWS SDK four times over (a third of a cold CI run); here they are checked once,
# together: one workspace of the unpacked packages, each depending on the others' packaged
# sources, with this workspace's lock file and profiles.
cargo publish --workspace --dry-run --no-verify --locked
publishable=$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["publish"] != []:
        print(p["name"], p["version"])
')
# shellcheck disable=SC2046 # one `-p` and a name per word
cargo package --no-verify --locked $(while read -r name _; do echo "-p $name"; done <<<"$publishable")
packaged="$target/package-check"
rm -rf "$packaged" && mkdir -p "$packaged"
{
    echo '[workspace]'
    echo 'resolver = "3"'
    echo 'members = ['
    while read -r name version; do echo "    \"$name-$version\","; done <<<"$publishable"
    echo ']'
    echo '[patch.crates-io]'
    while read -r name version; do echo "$name = { path = \"$name-$version\" }"; done <<<"$publishable"
    sed -n '/^\[profile/,$p' Cargo.toml
} >"$packaged/Cargo.toml"
while read -r name version; do
    tar -xzf "$target/package/$name-$version.crate" -C "$packaged"
done <<<"$publishable"
cp Cargo.lock "$packaged/"
CARGO_TARGET_DIR="$target" cargo check --manifest-path "$packaged/Cargo.toml" --workspace \
    --lib --bins --all-features
echo "ok: the packaged sources of $(wc -l <<<"$publishable") crates compile"

# The reconciler function: the binary, as `bootstrap` in a zip. The one the test command
# builds (the dev profile, the tests' features), not `--release` as deploy/README.md has
# it: what this checks (it links, the glibc it asks for, the zip's layout) does not depend
# on optimization or on features that only add code, and a build of its own compiled the
# AWS SDK again (two minutes of a cold CI run; four and a half with `--release`).
source scripts/built.sh
bootstrap=$(built_executable bin sluice-reconciler-lambda)
lambda="$target/lambda-zip"
rm -rf "$lambda" && mkdir -p "$lambda"
cp "$bootstrap" "$lambda/bootstrap"
# The provided.al2023 runtime has glibc 2.34: a binary asking for newer symbols would not
# start there (build with cargo-lambda instead, as deploy/README.md says).
glibc=$(objdump -T "$lambda/bootstrap" | { grep -o 'GLIBC_[0-9.]*' || true; } |
    sed 's/GLIBC_//' | sort -uV | tail -n 1)
if [ -z "$glibc" ]; then
    echo "FAILED: found no glibc symbol versions in $lambda/bootstrap (objdump -T)" >&2
    exit 1
fi
if [ "$(printf '%s\n' "$glibc" 2.34 | sort -V | tail -n 1)" != 2.34 ]; then
    echo "FAILED: bootstrap needs glibc $glibc; Amazon Linux 2023 has 2.34" >&2
    exit 1
fi
echo "ok: bootstrap needs glibc $glibc at most (Amazon Linux 2023 has 2.34)"
(cd "$lambda" && python3 -m zipfile -c reconciler.zip bootstrap)
python3 - "$lambda/reconciler.zip" <<'PY'
import stat, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    info = z.getinfo("bootstrap")
    assert info.file_size > 0, "empty bootstrap"
    assert (info.external_attr >> 16) & stat.S_IXUSR, "bootstrap is not executable in the zip"
print(f"ok: {sys.argv[1]} holds an executable bootstrap of {info.file_size} bytes")
PY

# The API checker, built by the test build before the RUSTC_BOOTSTRAP builds below.
api_check=$(built_executable bin api-check)

# docs.rs documents with nightly and `--cfg docsrs`; RUSTC_BOOTSTRAP lets this stable
# toolchain take the same path (`doc_cfg`), and warnings (broken links) fail it. Last:
# build scripts that probe the toolchain (proc-macro2's) run again when RUSTC_BOOTSTRAP
# changes, and with them everything compiled after them, so every other build of the CI run
# comes before this one.
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo doc --no-deps --locked \
    -p sluice-limiter -p sluice-dimension -p sluice-macros -p sluice-tower -p sluice-reqwest \
    -p sluice-lambda --features sluice-limiter/dynamodb,sluice-limiter/macros,sluice-limiter/serde,sluice-limiter/unstable-store,sluice-tower/http
marked() {
    if ! grep -q "Available on <strong>crate feature <code>$2</code></strong> only" "$target/doc/$1"; then
        echo "FAILED: $1 does not say it needs the crate feature $2" >&2
        exit 1
    fi
    echo "ok: $1 is marked as needing the feature $2"
}
marked sluice_tower/struct.TooManyRequestsLayer.html http
marked sluice/store/struct.DynamoStore.html dynamodb
marked sluice/attr.rate_limited.html macros
marked sluice/store/trait.Store.html unstable-store

# The public API of each published crate, as committed under api/ (after the docs, for the
# same reason: rustdoc's JSON needs RUSTC_BOOTSTRAP too).
API_CHECK_BIN="$api_check" ./scripts/check-api.sh
