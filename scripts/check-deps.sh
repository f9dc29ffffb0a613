#!/usr/bin/env bash
# Fails when one of our crates pulls in a second version of rand, toml or syn: for every
# such crate found twice in the dependency graph, no workspace member may depend directly
# on any version but the newest. (A second version that only other crates need, such as
# syn 2 under tracing-attributes, is theirs to remove, and is listed for information.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
tree=(cargo tree --workspace --all-features -e normal,build,dev)
failed=0
for crate in rand rand_core toml syn; do
    versions=$("${tree[@]}" -d --depth 0 --prefix none |
        awk -v c="$crate" '$1 == c { print $2 }' | sort -uV)
    [ -n "$versions" ] || { echo "ok: one version of $crate"; continue; }
    newest=$(tail -n 1 <<< "$versions")
    for version in $versions; do
        [ "$version" = "$newest" ] && continue
        spec="$crate@${version#v}"
        # Direct dependents of the older version; ours carry their path in parentheses.
        ours=$("${tree[@]}" -i "$spec" --depth 1 --prefix none |
            tail -n +2 | grep -F "($root/" || true)
        if [ -n "$ours" ]; then
            echo "FAILED: $crate $version (not the newest, $newest) is a direct dependency of:"
            sed 's/^/    /' <<< "$ours"
            failed=1
        else
            others=$("${tree[@]}" -i "$spec" --depth 1 --prefix none |
                tail -n +2 | sort -u | awk '{ print $1 }' | paste -sd, -)
            echo "ok: $crate $version is only other crates' ($others); ours use $newest"
        fi
    done
done
exit "$failed"
