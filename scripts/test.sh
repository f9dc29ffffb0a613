#!/usr/bin/env bash
# Runs the whole test suite of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-features
