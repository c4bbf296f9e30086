#!/bin/sh
# `make run`: the default scenario matrix on the embedded default (the reference and the CPU
# backend, ranks simulated in one process); reports under OUTDIR. report.html must stay under 300 KB
# (passing cases are one line each; their details are in report.json).
# usage: run-default.sh CLI OUTDIR
set -eu
cli=$1
out=$2
mkdir -p "$out"
"$cli" run scenarios/default.yaml --report "$out" --cache "$out/cache"
size=$(wc -c <"$out/report.html")
if [ "$size" -ge 307200 ]; then
    echo "run-default: $out/report.html is $size bytes, over the 300 KB a person can open" >&2
    exit 1
fi
