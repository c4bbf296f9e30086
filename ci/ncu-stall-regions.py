#!/usr/bin/env python3
"""Where a kernel's warp-stall samples fall, region by region of its SASS.

Reads Nsight Compute's source page as CSV (`ncu -i REPORT --page source --csv --print-source sass`),
bare or as it sits in a ci/device-check.sh step log (lines prefixed by "   | "), and splits the
instructions at every block barrier, EXIT and memory barrier: for each region with at least
--min-share of the samples, its share of all samples, the warp instructions it executed, its
distinct executed instructions and the 128-byte instruction lines they span, and its four largest
stall reasons. The totals say how much of the kernel waits on instruction fetch (no_instruction),
which is what a one-block kernel running its code once per launch mostly does (docs/cuda.md).

usage: ncu-stall-regions.py FILE [--min-share PERCENT]   (FILE "-": standard input)
exit status: 0 printed; 2 no source page with stall samples in FILE
"""
import csv
import sys


def rows_of(lines):
    body = []
    for line in lines:
        i = line.find('"')
        if i >= 0 and (i == 0 or line[:i].strip() in ("", "|")):
            body.append(line[i:].rstrip("\n"))
    return list(csv.reader(body))


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    path, min_share = argv[0], 2.0
    if len(argv) == 3 and argv[1] == "--min-share":
        min_share = float(argv[2])
    elif len(argv) != 1:
        print("ncu-stall-regions.py: usage: FILE [--min-share PERCENT]", file=sys.stderr)
        return 2
    try:
        src = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")
        rows = rows_of(src)
    except OSError as e:
        print(f"ncu-stall-regions.py: {path}: {e.strerror}", file=sys.stderr)
        return 2
    hdr = next((r for r in rows if r and r[0] == "Address"), None)
    if hdr is None or "Warp Stall Sampling (All Samples)" not in hdr or "Instructions Executed" not in hdr:
        print(f"ncu-stall-regions.py: {path}: no SASS source page with warp stall samples "
              "(ncu --page source --csv --print-source sass)", file=sys.stderr)
        return 2
    col = {h: i for i, h in enumerate(hdr)}
    i_samp, i_exec, i_src = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"], col["Source"]
    stalls = [(h[6:], i) for h, i in col.items() if h.startswith("stall_") and "Not Issued" not in h]
    data = [r for r in rows if r and r[0].startswith("0x") and len(r) == len(hdr)]

    def num(r, i):
        try:
            return int(float(r[i]))
        except ValueError:
            return 0

    total = sum(num(r, i_samp) for r in data)
    if not data or total == 0:
        print(f"ncu-stall-regions.py: {path}: the source page has no stall samples", file=sys.stderr)
        return 2
    regions, cur = [], []
    for k, r in enumerate(data):
        cur.append(k)
        op = r[i_src].split()
        op = op[1] if op and op[0].startswith("@") and len(op) > 1 else (op[0] if op else "")
        if op.startswith(("BAR", "EXIT", "MEMBAR")):
            regions.append(cur)
            cur = []
    if cur:
        regions.append(cur)

    def summary(ks):
        samp = sum(num(data[k], i_samp) for k in ks)
        ex = [k for k in ks if num(data[k], i_exec) > 0]
        lines = {int(data[k][0], 16) // 128 for k in ex}
        why = {}
        for k in ks:
            for name, i in stalls:
                v = num(data[k], i)
                if v:
                    why[name] = why.get(name, 0) + v
        return samp, sum(num(data[k], i_exec) for k in ex), len(ex), len(lines), why

    print(f"{'instructions':>13} {'samples':>8} {'share':>6} {'warp instr':>10} {'distinct':>8} {'lines':>5}  "
          "ends with / largest stall reasons (samples)")
    for ks in regions:
        samp, wi, nd, nl, why = summary(ks)
        if 100.0 * samp / total < min_share:
            continue
        top = ", ".join(f"{n} {v}" for n, v in sorted(why.items(), key=lambda x: -x[1])[:4])
        end = data[ks[-1]][i_src].strip()[:24]
        print(f"{ks[0]:6d}-{ks[-1]:<6d} {samp:8d} {100.0 * samp / total:5.1f}% {wi:10d} {nd:8d} {nl:5d}  {end}: {top}")
    samp, wi, nd, nl, why = summary(range(len(data)))
    fetch = why.get("no_inst", 0)  # ncu's stall_no_inst column
    print(f"all: {samp} samples, {wi} warp instructions, {nd} distinct executed instructions in {nl} lines of "
          f"128 bytes; waiting on instruction fetch (no_instruction): {100.0 * fetch / total:.1f}% of the samples")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
