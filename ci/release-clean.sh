#!/bin/sh
# The release library exports exactly the public API and holds no test machinery:
#  - every symbol LIB (default build/libdsv4moe.so) exports (nm -D --defined-only) is a function an
#    installed header (include/dsv4moe/*.h, what `make install` installs) declares with DSV4_API
#    (include/dsv4moe/api.h; the library is built -fvisibility=hidden);
#  - every function an installed header declares that the library holds (the static archive beside
#    it, ARCHIVE, default LIB's folder/libdsv4moe.a) is exported (a declaration without DSV4_API
#    would link for the tests, which use the archive, and fail for a user of the shared library);
#  - no exported symbol and no line of an installed header names test control, its hooks or the
#    defect catalogue. Those live in the fault build only (core/testctl.h, harness/fault_runs.h,
#    not installed; docs/scenarios.md, "The defect catalogue");
#  - the umbrella header include/dsv4moe/dsv4moe.h includes every other installed header but
#    comm_nccl.h and comm_devsim.h (their functions are in the NCCL and CUDA variants' libraries).
# For the production library (headers include/dsv4moe) also:
#  - it holds nothing of the harness (no scenario, runner, report, metric, export, check or symmetry
#    symbol: those are libdsv4moe_harness's) and needs no libyaml (ldd);
#  - each of its installed headers compiles alone with only include/dsv4moe beside it (without the
#    harness's headers).
# The harness library (HEADERS include/dsv4moe_harness, umbrella harness.h) is held to the same
# export rules against its own headers.
# Lists each offender and exits 1 when there is one. Run by `make test` (make release-clean, both
# libraries); the CUDA build's library too: sh ci/release-clean.sh build/cuda/libdsv4moe.so.
# usage: release-clean.sh [LIB [ARCHIVE [HEADERS]]]
set -eu
cd "$(dirname "$0")/.."
lib=${1:-build/libdsv4moe.so}
archive=${2:-$(dirname "$lib")/libdsv4moe.a}
hdir=${3:-include/dsv4moe}
case $hdir in
include/dsv4moe) umbrella=dsv4moe.h ;;
*) umbrella=harness.h ;;
esac
# "fault" not after a letter: "default" is fine, DSV4_FAULTS and dsv4_case_fault are not.
pat='(^|[^a-z])fault|defect|inject|testctl|test_control|testhook|test_hook|for_test'
bad=0
if [ ! -f "$lib" ]; then
    echo "release-clean: $lib does not exist (build it first: make all)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
# The installed headers without their comments, one declaration per line (split at ';').
for h in "$hdir"/*.h; do
    [ "$h" = include/dsv4moe/api.h ] && continue
    cc -fpreprocessed -dD -E -P -x c "$h"
done | grep -v '^#' | tr '\n' ' ' | tr ';' '\n' >"$tmp/decls"
# The names declared with DSV4_API, and every name an installed header declares as a function.
grep 'DSV4_API ' "$tmp/decls" | sed -e 's/.*DSV4_API //' -e 's/(.*//' | awk '{print $NF}' | tr -d '*' |
    sort -u >"$tmp/api"
grep -oE '[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\([^*]' "$tmp/decls" | sed 's/[[:space:]]*(.*//' | sort -u >"$tmp/declared"
nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u >"$tmp/exported"
if [ ! -s "$tmp/api" ] || [ ! -s "$tmp/exported" ]; then
    echo "release-clean: no DSV4_API declaration in $hdir or no symbol exported by $lib" >&2
    exit 1
fi

extra=$(comm -23 "$tmp/exported" "$tmp/api")
if [ -n "$extra" ]; then
    echo "release-clean: $lib exports symbols no installed header declares with DSV4_API:" $extra >&2
    bad=1
fi
if [ -f "$archive" ]; then
    nm --defined-only -g "$archive" 2>/dev/null | awk 'NF == 3 && $2 == "T" {print $3}' | sort -u >"$tmp/held"
    missing=$(comm -12 "$tmp/declared" "$tmp/held" | comm -23 - "$tmp/exported")
    if [ -n "$missing" ]; then
        echo "release-clean: $lib does not export functions $hdir declares (DSV4_API missing?):" \
            $missing >&2
        bad=1
    fi
else
    echo "release-clean: $archive does not exist: the check that every declared function is exported is skipped" >&2
fi
syms=$(grep -Ei "$pat" "$tmp/exported" || true)
if [ -n "$syms" ]; then
    echo "release-clean: $lib exports test or fault symbols:" $syms >&2
    bad=1
fi
lines=$(grep -nEi "$pat" "$hdir"/*.h || true)
if [ -n "$lines" ]; then
    printf 'release-clean: installed headers mention test control or the fault catalogue:\n%s\n' "$lines" >&2
    bad=1
fi
# The umbrella header includes every installed header but the two whose functions live in other
# libraries (it says why).
for h in "$hdir"/*.h; do
    n=${h##*/}
    case $n in "$umbrella" | comm_nccl.h | comm_devsim.h) continue ;; esac
    if ! grep -q "^#include \"${hdir#include/}/$n\"" "$hdir/$umbrella"; then
        echo "release-clean: $hdir/$umbrella does not include the installed header $n" >&2
        bad=1
    fi
done
if [ "$hdir" = include/dsv4moe ]; then
    harn=$(grep -E '^dsv4_(scenario|run_|case_|report|result_|compare|routing|export|check_|symmetry|trace|engine)' \
        "$tmp/exported" || true)
    if [ -n "$harn" ]; then
        echo "release-clean: $lib exports harness symbols (they belong in libdsv4moe_harness):" $harn >&2
        bad=1
    fi
    if nm -D "$lib" | grep -q ' yaml_'; then
        echo "release-clean: $lib refers to libyaml symbols" >&2
        bad=1
    fi
    if ldd "$lib" 2>/dev/null | grep -q libyaml; then
        echo "release-clean: $lib needs libyaml (ldd): the production library must not" >&2
        bad=1
    fi
    # each production header alone, with only its own folder to include from
    mkdir -p "$tmp/inc/dsv4moe"
    cp include/dsv4moe/*.h "$tmp/inc/dsv4moe/"
    for h in include/dsv4moe/*.h; do
        n=${h##*/}
        printf '#include <dsv4moe/%s>\nint dsv4_release_clean_unit;\n' "$n" >"$tmp/unit.c"
        if ! cc -std=c11 -Wall -Werror -fsyntax-only -I"$tmp/inc" "$tmp/unit.c" 2>"$tmp/cc.err"; then
            echo "release-clean: include/dsv4moe/$n does not compile without the harness's headers:" >&2
            cat "$tmp/cc.err" >&2
            bad=1
        fi
    done
fi
[ "$bad" = 0 ] || exit 1
echo "release-clean: $lib exports $(wc -l <"$tmp/exported") symbols, each declared with DSV4_API in" \
    "$hdir/*.h ($(wc -l <"$tmp/api") declared), no test or fault symbol; the headers mention none"
