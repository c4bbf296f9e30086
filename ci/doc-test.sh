#!/bin/sh
# Runs the shell blocks of README.md and docs/*.md that are marked runnable, so the documentation
# cannot drift from the program: a fenced ```sh block whose line before is `<!-- runnable -->`.
# The blocks of one file run in order in one bash (-e, pipefail) from the repository root, as a
# reader types them after `make all` (commands as the build puts them: build/dsv4moe); `python3`
# is $PYTHON (default python3). Each file's output goes to out/doc-test/<file>.log; the first
# failing block fails the run, naming its file and line, with the end of its output.
# usage: ci/doc-test.sh [FILE.md ...]   (make doc-test builds first)
set -eu
cd "$(dirname "$0")/.."
out=out/doc-test
rm -rf "$out"
mkdir -p "$out/bin"
# `python3` in the blocks is the interpreter the build uses (NumPy installed by ci/deps.sh)
py=$(command -v "${PYTHON:-python3}")
ln -s "$py" "$out/bin/python3"
[ $# -gt 0 ] || set -- README.md docs/*.md
total=0
for f in "$@"; do
    script="$out/$(echo "$f" | tr '/' '_').sh"
    # marker line, then the fence: every line until the closing fence, each block announced
    awk -v file="$f" '
        /^<!-- runnable -->[ \t]*$/ { armed = NR; next }
        armed == NR - 1 && /^```(sh|bash)[ \t]*$/ { inblock = 1; n++; printf "echo \"doc-test: %s:%d\" >&2\n", file, NR; next }
        inblock && /^```[ \t]*$/ { inblock = 0; next }
        inblock { print }
    ' "$f" >"$script"
    blocks=$(grep -c '^echo "doc-test: ' "$script" || true)
    [ "$blocks" -gt 0 ] || { rm -f "$script"; continue; }
    total=$((total + blocks))
    log="$out/$(echo "$f" | tr '/' '_').log"
    if ! PATH="$PWD/$out/bin:$PATH" bash -e -o pipefail "$script" >"$log" 2>&1; then
        at=$(grep '^doc-test: ' "$log" | tail -n 1 | sed 's/^doc-test: //')
        echo "doc-test: the block at $at failed; the end of its output ($log):" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
    echo "doc-test: $f: $blocks runnable blocks ran"
done
echo "doc-test: $total blocks in all, every one ran"
