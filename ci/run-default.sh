#!/bin/sh
# `make run`: until the scenario runner exists, generates a layer of each mini
# preset (hash and non-hash layers, fp4/fp8/bf16, top-p) and its input, inspects
# it, runs the reference on it, and prints a short summary.
# usage: run-default.sh CLI OUTDIR
set -eu
cli=$1
out=$2
mkdir -p "$out"
log="$out/run.log"
summary="$out/summary.txt"
: > "$log"
printf '%-10s %-5s %-7s %-42s %-40s %s\n' preset layer tokens routing clamp hash > "$summary"
for spec in "mini 0" "mini 1" "mini-fp8 2" "mini-bf16 3" "mini-topp 1"; do
    set -- $spec
    dir="$out/gen/$1-layer$2"
    "$cli" gen --preset "$1" --layer "$2" --tokens 32 --seed 1 --out "$dir" >> "$log"
    "$cli" inspect --quiet "$dir/model.safetensors" >> "$log"
    "$cli" ref --preset "$1" --layer "$2" --weights "$dir/model.safetensors" --input "$dir/input.safetensors" \
        --out "$dir/ref.safetensors" > "$dir/ref.txt"
    cat "$dir/ref.txt" >> "$log"
    routing=$(sed -n 's/^  routing: //p' "$dir/ref.txt")
    clamp=$(sed -n 's/^  clamp (L = [^)]*): //p' "$dir/ref.txt" | sed 's/ of [0-9]*//g')
    hash=$(sed -n 's/.*(hash \([0-9a-f]*\)).*/\1/p' "$dir/ref.txt")
    printf '%-10s %-5s %-7s %-42s %-40s %s\n' "$1" "$2" 32 "$routing" "$clamp" "$hash" >> "$summary"
done
cat "$summary"
echo "make run: outputs under $out/gen, full log $log"
