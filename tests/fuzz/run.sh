#!/bin/sh
# Runs one libFuzzer target (built by `make fuzz`) on a working copy of its
# kept corpus, then merges what it found back into tests/fuzz/corpus/TARGET
# (-merge=1 keeps only inputs that add coverage). Crashes land in
# build/fuzz/artifacts/TARGET/; copy each one into tests/fuzz/crashes/TARGET/
# once it is fixed, so `make test` replays it.
# usage: tests/fuzz/run.sh TARGET [SECONDS]   (niced; one target at a time)
set -eu
t=$1
secs=${2:-600}
bin=build/fuzz/fuzz/fuzz_$t
work=build/fuzz/work/$t
art=build/fuzz/artifacts/$t
mkdir -p "$work" "$art" tests/fuzz/corpus/"$t"
cp tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
nice -n 19 "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -artifact_prefix="$art"/ -print_final_stats=1 "$work" 2>&1 | tail -n 40 > build/fuzz/"$t".log || true
merged=build/fuzz/merged/$t
rm -rf "$merged"; mkdir -p "$merged"
nice -n 19 "$bin" -merge=1 "$merged" "$work" > build/fuzz/"$t".merge.log 2>&1
rm -f tests/fuzz/corpus/"$t"/*
cp "$merged"/* tests/fuzz/corpus/"$t"/
grep -E "stat::number_of_executed_units|Done|ERROR|SUMMARY" build/fuzz/"$t".log || true
echo "$t: kept $(ls tests/fuzz/corpus/"$t" | wc -l) inputs, $(du -sk tests/fuzz/corpus/"$t" | cut -f1) KB"
