#!/bin/sh
# `make coverage`: lcov summary and HTML report of a --coverage build, and the
# gate of coverage/thresholds (the scope's folders together; each folder is
# reported on its own too). Writes OUTDIR/index.html, OUTDIR/summary.txt;
# exits 1 when the scope is below a threshold.
# usage: report.sh BUILDDIR OUTDIR
set -eu
build=$1
out=$2
thr=coverage/thresholds
rc="--rc lcov_branch_coverage=1"
mkdir -p "$out"
# shellcheck disable=SC2086
lcov --quiet --capture --directory "$build" --output-file "$out/all.info" $rc 2>&1 | grep -v 'redefined at' >&2 || true
test -s "$out/all.info"
# shellcheck disable=SC2086
lcov --quiet --extract "$out/all.info" "$(pwd)/core/*" "$(pwd)/ref/*" "$(pwd)/fast/*" "$(pwd)/harness/*" "$(pwd)/compare/*" \
    "$(pwd)/scenarios/*" --output-file "$out/lib.info" $rc 2>/dev/null
# shellcheck disable=SC2086
genhtml --quiet --branch-coverage --output-directory "$out" "$out/lib.info" 2>/dev/null

# "lines......: 89.6% (6545 of 7262 lines)" -> "6545 7262"
counts() { lcov --summary "$1" $rc 2>&1 | sed -n "s/^ *$2\.*: [0-9.]*% (\([0-9]*\) of \([0-9]*\).*/\1 \2/p"; }
pct() { awk -v h="$1" -v n="$2" 'BEGIN { if (n + 0 == 0) print "0.0"; else printf "%.1f", 100 * h / n }'; }  # no data fails the gate
line() { # name info
    set -- "$1" "$(counts "$2" lines)" "$(counts "$2" branches)"
    # shellcheck disable=SC2086
    printf '%-22s lines %6s%% (%s)   branches %6s%% (%s)\n' "$1" "$(pct $2)" "$(echo "$2" | tr ' ' /)" \
        "$(pct $3)" "$(echo "$3" | tr ' ' /)"
}
scope=$(sed -n 's/^scope //p' "$thr")
min_lines=$(sed -n 's/^lines //p' "$thr")
min_branches=$(sed -n 's/^branches //p' "$thr")
pats=""
for d in $scope; do pats="$pats $(pwd)/$d/*"; done
# shellcheck disable=SC2086
lcov --quiet --extract "$out/lib.info" $pats --output-file "$out/gate.info" $rc 2>/dev/null
{
    echo "coverage of the library (lcov, $(date -u +%Y-%m-%dT%H:%MZ))"
    line "all of the library" "$out/lib.info"
    for d in core ref fast/backend fast/plan fast/cpu fast/comm fast/multirank harness scenarios; do
        # shellcheck disable=SC2086
        lcov --quiet --extract "$out/lib.info" "$(pwd)/$d/*" --output-file "$out/one.info" $rc 2>/dev/null &&
            line "  $d/" "$out/one.info"
    done
    line "gate: $scope" "$out/gate.info"
    echo "thresholds (coverage/thresholds): lines $min_lines%, branches $min_branches%"
} > "$out/summary.txt"
rm -f "$out/one.info"
cat "$out/summary.txt"
gl=$(counts "$out/gate.info" lines)
gb=$(counts "$out/gate.info" branches)
# shellcheck disable=SC2086
ok=$(awk -v l="$(pct $gl)" -v b="$(pct $gb)" -v ml="$min_lines" -v mb="$min_branches" \
    'BEGIN { print (l + 0 >= ml + 0 && b + 0 >= mb + 0) ? "yes" : "no" }')
echo "coverage: HTML report in $out/index.html"
if [ "$ok" != yes ]; then
    echo "coverage: FAILED: the gate ($scope) is below lines $min_lines% / branches $min_branches%" >&2
    exit 1
fi
echo "coverage: gate passed"
