#!/bin/sh
# No library source file over LIMIT lines (default 1000): every C, CUDA and header file git tracks
# under core/, ref/, fast/, harness/, compare/, scenarios/ and include/ (the libraries and their headers; tests,
# benchmarks, the CLI and Python are not the library). Lists each offender with its line count and
# exits 1 when there is one. Run by `make test` (target line-limit) and .ci/run.
#
# PENDING: files over the limit that open work is splitting, each with the issue that does; they
# are listed as pending, not failed. The check fails when a pending file is no longer over the
# limit (take it off the list) so the list cannot go stale. Generated files: none in the library.
# usage: line-limit.sh [LIMIT]
set -eu
cd "$(dirname "$0")/.."
limit=${1:-1000}
PENDING=""

pending_issue() { # path -> the issue number, or nothing
    for p in $PENDING; do
        [ "${p%%:*}" = "$1" ] && { echo "${p##*:}"; return; }
    done
    return 0
}

bad=0
over=$(git ls-files -- core ref fast harness compare scenarios include | grep -E '\.(c|h|cu|cuh)$' |
    while read -r f; do
        [ -f "$f" ] && printf '%s %s\n' "$(wc -l < "$f")" "$f"
    done | awk -v l="$limit" '$1 > l')
echo "$over" | while read -r n f; do
    [ -n "$f" ] || continue
    i=$(pending_issue "$f")
    if [ -n "$i" ]; then
        echo "line-limit: $f: $n lines (over $limit; pending: left to issue $i, which is changing this file)"
    else
        echo "line-limit: $f: $n lines, over the $limit-line limit for a library source file" >&2
    fi
done
for f in $(echo "$over" | awk '{print $2}'); do
    [ -n "$(pending_issue "$f")" ] || bad=1
done
for p in $PENDING; do
    f=${p%%:*}
    if ! echo "$over" | awk '{print $2}' | grep -qx "$f"; then
        echo "line-limit: $f is listed as pending in ci/line-limit.sh but is not over $limit lines: take it off the list" >&2
        bad=1
    fi
done
if [ "$bad" != 0 ]; then
    echo "line-limit: FAILED (split the file, mechanically, by what its parts do)" >&2
    exit 1
fi
echo "line-limit: no library source file over $limit lines (pending splits aside)"
