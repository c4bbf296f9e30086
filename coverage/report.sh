#!/bin/sh
# `make coverage`: lcov summary and HTML report of a --coverage build.
# usage: report.sh BUILDDIR OUTDIR
set -eu
build=$1
out=$2
mkdir -p "$out"
lcov --quiet --capture --directory "$build" --output-file "$out/all.info" --rc lcov_branch_coverage=1
lcov --quiet --extract "$out/all.info" "$(pwd)/core/*" "$(pwd)/ref/*" "$(pwd)/fast/*" "$(pwd)/compare/*" \
    "$(pwd)/scenarios/*" --output-file "$out/lib.info" --rc lcov_branch_coverage=1
genhtml --quiet --branch-coverage --output-directory "$out" "$out/lib.info"
lcov --summary "$out/lib.info" --rc lcov_branch_coverage=1 2>&1 | tee "$out/summary.txt"
echo "coverage: HTML report in $out/index.html"
