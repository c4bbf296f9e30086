#!/usr/bin/env python3
"""The short table that ci/device-check.sh prints last, and its results.json.

Reads, from the bench folder of one device-check call (every file optional; what is missing shows as "-"):
  ceilings.json                  bench/ceilings.cu: copy GB/s, FP8 block-scaled GEMM TFLOP/s, ...
  bench_cuda_exact.json,         bench_cuda per numerics mode (device-check runs it once per mode when
  bench_cuda_fp8.json            bench_cuda takes --gemm); else bench_cuda.json (one run, mode "cuda").
                                 Rows that carry a "gemm" key are filed under that mode instead.
  torch_peer.json                bench/torch_peer.py (peer_ms per T)
  hf_peer.json                   bench/hf_peer.py: HF's DeepseekV4SparseMoeBlock, grouped_mm, bf16 (ms per T)
  gmm_peer.json                  bench/scaled_gmm_peer.py: torch._scaled_grouped_mm, GEMMs only (gemm_ms per T)
  *.json                         any bench JSON whose rows carry a "timeline" (bench_cuda --timeline): each
                                 such row's step as the GPU ran it, listed after the targets
and the steps table (steps.tsv: name, status, seconds, note). Prints the steps, the ceilings, and per T:
dsv4moe ms in each mode (the best configuration of that T: graph on/off, host/device/stream io), the share of
the copy and FP8 ceilings of the lead mode (fp8 when it ran, else the only one), each peer's ms, and
peer ms / dsv4moe ms (> 1: dsv4moe faster), then the targets of bench/targets.json (--targets FILE), each met,
NOT met, or not run (no T of its range timed, or its peer missing). Writes results.json beside.

usage: device-table.py --steps STEPS.tsv --bench DIR --out DIR [--seconds N] [--targets FILE]
"""
import argparse
import json
import os
import sys

MODES = ("exact", "fp8")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:  # noqa: BLE001 - a missing or broken file is a "-" in the table
        return None


def num(v):
    """A finite non-negative number, or None (bench_cuda writes -1 for "not measured")."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0 else None


def fmt(v, f="{:.3f}", width=0):
    s = f.format(v) if num(v) is not None else "-"
    return s.rjust(width) if width else s


HERE = os.path.dirname(os.path.abspath(__file__))


def read_targets(path):
    """bench/targets.json's list (name, what, tokens_min, tokens_max, metric, and one of max, min, above)."""
    t = load(path)
    out = []
    for x in (t or {}).get("targets", []):
        if isinstance(x, dict) and all(k in x for k in ("name", "what", "tokens_min", "tokens_max", "metric")):
            out.append(x)
    return out


def metric_of(row, lead, metric):
    """A row's value of a targets.json metric on the lead mode, or None where it was not measured."""
    if metric == "ms":
        return row.get(f"{lead}_ms")
    if metric in ("share_of_copy", "share_of_fp8"):
        return row.get(f"{lead}_{metric}")
    if metric in ("x_torch", "x_hf", "x_gmm"):
        return row.get(metric)
    if metric == "x_peers":
        xs = [row.get(k) for k in ("x_torch", "x_hf", "x_gmm") if row.get(k) is not None]
        return min(xs) if xs else None
    return None


def holds(t, v):
    if "max" in t:
        return v <= t["max"]
    if "min" in t:
        return v >= t["min"]
    return v > t.get("above", 0)


def read_steps(path):
    steps = []
    try:
        with open(path) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) >= 3:
                    steps.append({"step": p[0], "status": p[1], "seconds": int(p[2]) if p[2].isdigit() else 0,
                                  "note": p[3] if len(p) > 3 else ""})
    except OSError:
        pass
    return steps


def cuda_modes(bench):
    """{mode: {T: best row}}, and {mode: file} for the modes found, in order exact, fp8, others."""
    files = {m: os.path.join(bench, f"bench_cuda_{m}.json") for m in MODES}
    files = {m: p for m, p in files.items() if os.path.exists(p)}
    if not files and os.path.exists(os.path.join(bench, "bench_cuda.json")):
        files = {"cuda": os.path.join(bench, "bench_cuda.json")}
    modes, info = {}, {}
    for m, p in files.items():
        bc = load(p)
        info[m] = {"file": os.path.basename(p), "available": bool(bc and bc.get("available")),
                   "reason": (bc or {}).get("reason", "not readable" if bc is None else None),
                   "targets_issue7": (bc or {}).get("targets")}
        info[m]["timed"] = 0
        for r in (bc or {}).get("runs", []) if bc and bc.get("available") else []:
            if not r.get("ok") or "tokens" not in r or num(r.get("median_ms")) is None:
                why = r.get("error") or r.get("note")
                if why and not info[m].get("first_error"):
                    info[m]["first_error"] = why
                continue
            info[m]["timed"] += 1
            mode = str(r.get("gemm", m))
            best = modes.setdefault(mode, {})
            t = int(r["tokens"])
            if t not in best or r["median_ms"] < best[t]["median_ms"]:
                best[t] = r
    order = [m for m in MODES if m in modes] + sorted(m for m in modes if m not in MODES)
    return {m: modes[m] for m in order}, info


def peer_ms(doc, key):
    """{T: ms} of a peer JSON (rows under "runs" with "tokens" and `key`)."""
    out = {}
    for r in (doc or {}).get("runs", []):
        if isinstance(r, dict) and "tokens" in r and num(r.get(key)) is not None:
            out[int(r["tokens"])] = float(r[key])
    return out


def read_timelines(bench):
    """Every recorded timeline of the bench folder's JSONs: file, T, graph, cuda_kernels, the summary."""
    out = []
    for name in sorted(os.listdir(bench)) if os.path.isdir(bench) else []:
        doc = load(os.path.join(bench, name)) if name.endswith(".json") else None
        if not isinstance(doc, dict):
            continue
        for r in doc.get("runs", []):
            tl = r.get("timeline") if isinstance(r, dict) else None
            if not isinstance(tl, dict):
                continue
            out.append({"file": name, "tokens": r.get("tokens"), "graph": r.get("graph"),
                        "cuda_kernels": doc.get("cuda_kernels"), "error": tl.get("error"),
                        "span_us": tl.get("span_us"), "busy_us": tl.get("busy_us"), "sum_us": tl.get("sum_us"),
                        "rows": tl.get("rows", [])})
    return out


def print_timelines(tls):
    if not tls:
        return
    print("timelines (bench_cuda --timeline: medians of the recorded steps; each kernel's us, + the GPU's idle before it):")
    for t in tls:
        head = "  {} T {} graph {}".format(t["file"], t["tokens"], "on" if t["graph"] else "off")
        if t["error"]:
            print(head + ": not recorded: " + str(t["error"]))
            continue
        span, busy = num(t["span_us"]), num(t["busy_us"])
        share = "{:.0f} %".format(100 * busy / span) if span and busy is not None else "-"
        print(head + ": span {} us, GPU busy {} us ({}), kernels' sum {} us".format(
            fmt(span, "{:.1f}"), fmt(busy, "{:.1f}"), share, fmt(t["sum_us"], "{:.1f}")))
        parts = []
        for k in t["rows"]:
            idle = num(k.get("idle_us"))
            parts.append("{} {}{}".format(k.get("name"), fmt(k.get("dur_us"), "{:.1f}"),
                                          " (+{:.1f})".format(idle) if idle else ""))
        print("    " + ", ".join(parts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--targets", default=os.path.join(HERE, "..", "bench", "targets.json"))
    args = ap.parse_args()

    steps = read_steps(args.steps)
    targets_def = read_targets(args.targets)
    ce = load(os.path.join(args.bench, "ceilings.json"))
    tp = load(os.path.join(args.bench, "torch_peer.json"))
    hf = load(os.path.join(args.bench, "hf_peer.json"))
    gm = load(os.path.join(args.bench, "gmm_peer.json"))
    modes, cinfo = cuda_modes(args.bench)
    lead = "fp8" if "fp8" in modes else (next(iter(modes)) if modes else None)
    torch_ms, hf_ms, gmm_ms = peer_ms(tp, "peer_ms"), peer_ms(hf, "ms"), peer_ms(gm, "gemm_ms")
    hf_mode = {int(r["tokens"]): r.get("mode") for r in (hf or {}).get("runs", []) if "tokens" in r}
    fp8_ceiling = num((ce or {}).get("fp8_gemm_tflops"))
    copy_ceiling = num((ce or {}).get("copy_gbs"))

    print()
    print(f"device-check: {args.seconds} s")
    for s in steps:
        print(f"  {s['step']:<16} {s['status']:<8} {s['seconds']:4d}s  {s['note'][:100]}")
    if ce:
        print(f"ceilings: copy {fmt(ce.get('copy_gbs'), '{:.1f}')} GB/s (read+written); FP8 GEMM "
              f"{fmt(ce.get('fp8_gemm_tflops'), '{:.1f}')} TFLOP/s ({ce.get('fp8_gemm_kind')}: {ce.get('fp8_block_mode')}); "
              f"FP8 per-tensor {fmt(ce.get('fp8_tensor_tflops'), '{:.1f}')}; bf16 {fmt(ce.get('bf16_tflops'), '{:.1f}')}")
    else:
        print("ceilings: not measured")
    for m, i in cinfo.items():
        if not i["available"]:
            print(f"dsv4moe cuda ({m}, {i['file']}): not timed ({i['reason']})")
        elif not i["timed"]:
            print(f"dsv4moe cuda ({m}, {i['file']}): no T timed ({i.get('first_error') or 'no rows'})")
    if tp:
        print(f"torch peer: routed bf16-dequantized, torch._grouped_mm or loop, graph where faster; shared: {tp.get('shared_path')}")
    else:
        print("torch peer: did not run")
    if hf and hf.get("available"):
        print(f"HF peer: transformers {hf.get('transformers')} DeepseekV4SparseMoeBlock, experts "
              f"{hf.get('experts_implementation')} ({hf.get('experts_forward')}), bf16; graph: {hf.get('graph')}")
    else:
        print(f"HF peer: not timed ({(hf or {}).get('reason', 'did not run')})")
    if gm and gm.get("available"):
        print(f"scaled_grouped_mm peer: routed experts' two GEMMs only, e4m3 rowwise, groups {gm.get('groups')}; "
              f"graph: {gm.get('graph')}")
    else:
        print(f"scaled_grouped_mm peer: not timed ({(gm or {}).get('reason', 'did not run')})")

    Ts = sorted(set(torch_ms) | set(hf_ms) | set(gmm_ms) | {t for m in modes.values() for t in m})
    table = []
    for t in Ts:
        row = {"tokens": t}
        for m, best in modes.items():
            r = best.get(t)
            row[f"{m}_ms"] = r["median_ms"] if r else None
            if r:
                row[f"{m}_graph"] = bool(r.get("graph"))
                row[f"{m}_io"] = r.get("io", "host")
                row[f"{m}_share_of_copy"] = num(r.get("share_of_copy"))
                row[f"{m}_share_of_fp8"] = num(r.get("share_of_fp8_gemm"))
        ours = row.get(f"{lead}_ms") if lead else None
        row.update(torch_ms=torch_ms.get(t), hf_ms=hf_ms.get(t), hf_mode=hf_mode.get(t), gmm_ms=gmm_ms.get(t))
        g = next((r for r in (gm or {}).get("runs", []) if r.get("tokens") == t), None)
        row["gmm_share_of_fp8"] = num(g.get("tflops")) / fp8_ceiling if g and num(g.get("tflops")) and fp8_ceiling else None
        for p in ("torch", "hf", "gmm"):
            row[f"x_{p}"] = row[f"{p}_ms"] / ours if ours and row[f"{p}_ms"] else None
        # the targets of bench/targets.json that cover this T, on the lead mode
        tg = []
        for tgt in targets_def if ours else []:
            if tgt["tokens_min"] <= t <= tgt["tokens_max"]:
                v = metric_of(row, lead, tgt["metric"])
                tg.append(tgt["name"] + " " + ("n/a" if v is None else "ok" if holds(tgt, v) else "MISS"))
        row["targets"] = " ".join(tg)
        table.append(row)

    targets = {"mode": lead}
    for t in targets_def:
        vs = [metric_of(r, lead, t["metric"]) for r in table
              if lead and r.get(f"{lead}_ms") and t["tokens_min"] <= r["tokens"] <= t["tokens_max"]]
        vs = [v for v in vs if v is not None]
        targets[t["name"]] = None if not vs else all(holds(t, v) for v in vs)

    if table:
        mcols = list(modes) or ["cuda"]
        head = f"{'T':>6} " + " ".join(f"{m + ' ms':>9}" for m in mcols)
        head += f" {'cfg':>8} {'%copy':>6} {'%fp8':>6} {'torch ms':>9} {'HF ms':>9} {'gmm ms':>9} {'gmm%fp8':>7}"
        head += f" {'x torch':>7} {'x HF':>6} {'x gmm':>6}  targets ({lead or 'no cuda run'} mode)"
        print(head)
        for r in table:
            line = f"{r['tokens']:6d} " + " ".join(fmt(r.get(f"{m}_ms"), "{:.4f}", 9) for m in mcols)
            pct = (lambda v: fmt(None if v is None else 100 * v, "{:.1f}%", 6))
            hfm = {"graph": "g", "eager": "e"}.get(r["hf_mode"], "")
            io = {"device": "dev"}.get(r.get(f"{lead}_io"), r.get(f"{lead}_io"))
            cfg = (("on " if r[f"{lead}_graph"] else "off ") + str(io)) if r.get(f"{lead}_ms") else "-"
            line += f" {cfg:>8} {pct(r.get(f'{lead}_share_of_copy'))} {pct(r.get(f'{lead}_share_of_fp8'))}"
            line += f" {fmt(r['torch_ms'], '{:.4f}', 9)} {fmt(r['hf_ms'], '{:.4f}', 8)}{hfm or ' '} {fmt(r['gmm_ms'], '{:.4f}', 9)}"
            line += f" {pct(r['gmm_share_of_fp8']):>7}"
            line += f" {fmt(r['x_torch'], '{:.2f}x', 7)} {fmt(r['x_hf'], '{:.2f}x', 6)} {fmt(r['x_gmm'], '{:.2f}x', 6)}  {r['targets']}"
            print(line)
        print(f"  ms: median; dsv4moe = bench_cuda's best configuration of each T per mode (cfg: the {lead or '-'} mode's graph on/off, io host/device/stream; stream = CUDA events around back-to-back enqueues, the peers' method); %copy / %fp8: the {lead or '-'} "
              f"mode's touched-weight GB/s and FLOP/s against the ceilings (copy {fmt(copy_ceiling, '{:.0f}')} GB/s, "
              f"FP8 {fmt(fp8_ceiling, '{:.0f}')} TFLOP/s); HF ms g = CUDA-graph replay, e = eager; gmm = "
              f"torch._scaled_grouped_mm on the routed GEMMs only; x P = P ms / dsv4moe ms ({lead or '-'} mode; > 1: dsv4moe faster)")
        word = {True: "met", False: "NOT met", None: "not run"}
        print("targets ({} mode, {}):".format(lead or "-", os.path.relpath(args.targets)))
        for t in targets_def:
            print("  {:<22} {:<8} {}".format(t["name"], word[targets[t["name"]]], t["what"]))
    else:
        print("nothing timed: no dsv4moe or peer times in this call")
    timelines = read_timelines(args.bench)
    print_timelines(timelines)

    res = {
        "seconds": args.seconds,
        "steps": steps,
        "ceilings": ce and {k: ce.get(k) for k in (
            "copy_gbs", "fp8_gemm_tflops", "fp8_gemm_kind", "fp8_block_mode", "fp8_tensor_tflops", "bf16_tflops")},
        "torch_peer_ms": {str(t): v for t, v in torch_ms.items()},
        "hf_peer": {"available": bool(hf and hf.get("available")), "reason": (hf or {}).get("reason"),
                    "transformers": (hf or {}).get("transformers"), "graph": (hf or {}).get("graph"),
                    "ms": {str(t): v for t, v in hf_ms.items()}},
        "gmm_peer": {"available": bool(gm and gm.get("available")), "reason": (gm or {}).get("reason"),
                     "groups": (gm or {}).get("groups"), "gemm_ms": {str(t): v for t, v in gmm_ms.items()}},
        "cuda_available": any(i["available"] for i in cinfo.values()),
        "cuda_modes": {m: dict(i, best_ms={str(t): r["median_ms"] for t, r in modes.get(m, {}).items()})
                       for m, i in cinfo.items()},
        "cuda_best_ms": {str(t): r["median_ms"] for t, r in modes.get(lead, {}).items()} if lead else {},
        "targets": (cinfo.get(lead) or next(iter(cinfo.values()), {})).get("targets_issue7"),
        "targets_met": targets,
        "targets_file": os.path.relpath(args.targets),
        "table": table,
        "timelines": timelines,
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
