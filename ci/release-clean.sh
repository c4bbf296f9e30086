#!/bin/sh
# The release library and its installed headers hold no test machinery: no symbol that LIB
# (default build/libdsv4moe.so) exports and no line of include/dsv4moe/*.h (what `make install`
# installs) names test control, its hooks or the defect catalogue. Those live in the fault build
# only (core/testctl.h, harness/fault_runs.h, not installed; docs/scenarios.md, "The defect
# catalogue"). Lists each offender and exits 1 when there is one. Run by `make test`.
# usage: release-clean.sh [LIB]
set -eu
cd "$(dirname "$0")/.."
lib=${1:-build/libdsv4moe.so}
# "fault" not after a letter: "default" is fine, DSV4_FAULTS and dsv4_case_fault are not.
pat='(^|[^a-z])fault|defect|inject|testctl|test_control|testhook|test_hook|for_test'
bad=0
if [ ! -f "$lib" ]; then
    echo "release-clean: $lib does not exist (build it first: make all)" >&2
    exit 1
fi
syms=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -Ei "$pat" || true)
if [ -n "$syms" ]; then
    echo "release-clean: $lib exports test or fault symbols:" $syms >&2
    bad=1
fi
lines=$(grep -nEi "$pat" include/dsv4moe/*.h || true)
if [ -n "$lines" ]; then
    printf 'release-clean: installed headers mention test control or the fault catalogue:\n%s\n' "$lines" >&2
    bad=1
fi
[ "$bad" = 0 ] || exit 1
echo "release-clean: $lib exports no test or fault symbol; include/dsv4moe/*.h mention none"
