#!/usr/bin/env python3
"""The kernel variants against the default of the same pass, from bench_cuda's JSONs.

usage: variant-table.py MANIFEST

ci/device-check.sh's profiles time each params variant with bench_cuda (its bench_variants) and list
every run in MANIFEST ($WORK/bench/variants.tsv), a line each: the profile, the params ("default"
for the defaults), the pass (1, 2, ...) and the JSON's path (a relative path is taken from the
manifest's folder). For every profile that has a default, this prints one row per variant and T:
the best io-stream median of each pass (graph off or on, as the closing table takes a T's best
configuration), the default's of the same pass, and their ratio (default ms / variant ms: above 1,
the variant is faster). A variant is "faster" at a T when it beats the default in every pass by
more than the default's own spread between passes (at least 2 %), "slower" when the reverse
holds, else "within spread". A run whose JSON is missing (its step failed or timed out) is left out.

exit status: 0 a table printed (or nothing to compare), 2 bad input (a malformed manifest line, a
JSON that does not parse or lacks bench_cuda's runs).
"""
import json
import os
import sys


def fail(msg):
    print(f"variant-table: {msg}", file=sys.stderr)
    sys.exit(2)


def best_stream(path):
    """{T: best io-stream median ms} of one bench_cuda JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: not a JSON file ({e})")
    runs = d.get("runs") if isinstance(d, dict) else None
    if not isinstance(runs, list):
        fail(f"{path}: no 'runs' list (not bench_cuda's JSON)")
    best = {}
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            fail(f"{path}: runs[{i}] is not an object")
        t, ms = r.get("tokens"), r.get("median_ms")
        if r.get("io") != "stream" or not r.get("ok", False):
            continue
        if not isinstance(t, int) or isinstance(t, bool) or not isinstance(ms, (int, float)) or ms <= 0:
            fail(f"{path}: runs[{i}] lacks an integer 'tokens' or a positive 'median_ms'")
        best[t] = min(best.get(t, ms), ms)
    return best


def verdict(ratios, spread):
    edge = max(spread, 0.02)
    if all(r > 1 + edge for r in ratios):
        return "faster"
    if all(r < 1 - edge for r in ratios):
        return "slower"
    return "within spread"


def main(argv):
    if len(argv) != 2:
        fail("usage: variant-table.py MANIFEST")
    man = argv[1]
    try:
        with open(man, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{man}: cannot read ({e})")
    base = os.path.dirname(os.path.abspath(man))
    runs = {}  # profile -> params -> pass -> path
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        f = line.split("\t")
        if len(f) != 4 or not f[0] or not f[1] or not f[2].isdigit() or not f[3]:
            fail(f"{man}:{n}: not 'profile<TAB>params<TAB>pass<TAB>json'")
        path = f[3] if os.path.isabs(f[3]) else os.path.join(base, f[3])
        if os.path.exists(path):
            runs.setdefault(f[0], {}).setdefault(f[1], {})[int(f[2])] = path
    printed = False
    for prefix in runs:
        tags = runs[prefix]
        if "default" not in tags or len(tags) < 2:
            continue
        default = {p: best_stream(f) for p, f in tags["default"].items()}
        print(f"{prefix}: each variant against the default of the same pass (io stream, best of graph off/on; "
              "x = default ms / variant ms)")
        print(f"  {'params':<48} {'T':>6}  {'variant ms':<22} {'default ms':<22} {'x':<16} verdict")
        for kv in (t for t in tags if t != "default"):
            got = {p: best_stream(f) for p, f in tags[kv].items()}
            passes = sorted(p for p in got if p in default)
            ts = sorted({t for p in passes for t in got[p] if t in default[p]})
            for t in ts:
                ps = [p for p in passes if t in got[p] and t in default[p]]
                vm = [got[p][t] for p in ps]
                dm = [default[p][t] for p in ps]
                ratios = [d / v for d, v in zip(dm, vm)]
                spread = (max(dm) - min(dm)) / min(dm) if len(dm) > 1 else 0.0
                print(f"  {kv:<48} {t:>6}  {' / '.join(f'{x:.4f}' for x in vm):<22} "
                      f"{' / '.join(f'{x:.4f}' for x in dm):<22} {' / '.join(f'{x:.3f}' for x in ratios):<16} "
                      f"{verdict(ratios, spread)}")
        printed = True
    if not printed:
        print(f"variant-table: no profile with a default and a variant in {man}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
