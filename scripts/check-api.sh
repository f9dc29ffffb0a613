#!/usr/bin/env bash
# The public API of every published crate, compared with its description under api/
# (`api/<crate>.txt`, one item a line), so that a change to it is a deliberate diff.
# `--bless` writes the descriptions instead.
#
# rustdoc's JSON output is unstable; RUSTC_BOOTSTRAP lets this stable toolchain write it,
# as scripts/check-release.sh's docs build does (and, like that build, this comes after
# every other build of a CI run: build scripts that probe the toolchain run again when
# RUSTC_BOOTSTRAP changes). Each crate is documented with the features docs.rs documents,
# so the API described is the one its users get (not `unstable-store`, which may change);
# warnings fail it, so the crates also build clean without that feature.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bless=()
if [ "${1:-}" = --bless ]; then bless=(--bless); fi
source scripts/built.sh
# Built before the RUSTC_BOOTSTRAP builds below, with the tests' features (see built.sh).
api_check=${API_CHECK_BIN:-$(built_executable bin api-check)}
status=0
while read -r package lib features; do
    RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo rustdoc --quiet --locked -p "$package" \
        --lib ${features:+--features "$features"} -- -Z unstable-options --output-format json
    "$api_check" "$target/doc/$lib.json" "api/$package.txt" "${bless[@]}" || status=1
done <<'CRATES'
sluice-limiter sluice dynamodb,macros,serde
sluice-dimension sluice_dimension
sluice-macros sluice_macros
sluice-tower sluice_tower http
sluice-reqwest sluice_reqwest
sluice-lambda sluice_lambda
CRATES
exit "$status"
