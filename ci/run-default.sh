#!/bin/sh
# `make run`: the default scenario matrix on the embedded default (the reference and the CPU
# backend, ranks simulated in one process); reports under OUTDIR.
# usage: run-default.sh CLI OUTDIR
set -eu
cli=$1
out=$2
mkdir -p "$out"
"$cli" run scenarios/default.yaml --report "$out" --cache "$out/cache"
