#!/bin/sh
# `make run`: until the scenario runner exists, generates a small layer of each
# mini preset and its input, inspects them, and prints a short summary.
# usage: run-default.sh CLI OUTDIR
set -eu
cli=$1
out=$2
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
for spec in "mini 0" "mini 1" "mini-fp8 2" "mini-bf16 3" "mini-topp 1"; do
    set -- $spec
    dir="$out/gen/$1-layer$2"
    "$cli" gen --preset "$1" --layer "$2" --tokens 32 --seed 1 --out "$dir" | tee -a "$summary"
    "$cli" inspect --quiet "$dir/model.safetensors" | tee -a "$summary"
done
echo "make run: summary written to $summary"
