#!/usr/bin/env python3
"""The GEMM-only peer: torch's own FP8 grouped GEMM, `torch._scaled_grouped_mm`
(e4m3 x e4m3, rowwise scales: one fp32 scale per activation row and one per weight row (output
column) of each expert, bf16 out), on the routed experts' two grouped GEMMs of v4-flash per T:

    gate/up   A [S, H]  x  W13 [E, 2I, H]^T  ->  [S, 2I]      (H 4096, I 2048, E 256, K 6)
    down      h [S, I]  x  W2  [E, H, I]^T   ->  [S, H]       S = T * K token-slots

Only the GEMMs: no router, no quantization of x or h, no SwiGLU, no combine, no shared expert. So this
is a floor for what torch's FP8 path spends on the routed experts, not a layer time.

How the S = T * K token-slots spread over the 256 experts ("dist" in the JSON):
  routed    (the table's) the counts the SPEC router gives on bench/torch_peer.py's gate and bias
            (make_router, generator seed 1, the torch and HF peers' router) for torch_peer's input
            x of that T (make_x, seed 1000 + T): the groups the two layer peers see at that T;
  balanced  S / E each (remainder to the first experts), the best case of a grouped GEMM.
The activations and weights are random e4m3 (N(0, 1) rounded; the values do not change the work).

Timing per T and dist: 3 warm-ups, CUDA events, median of reps; each GEMM alone (eager) and the pair
back to back, eager and replayed from a CUDA graph; gemm_ms = the pair's faster of the two.
TFLOP/s = 6 S H I / gemm_ms (2 S H 2I + 2 S I H). A check at T = 32 compares the result of both GEMMs
with an fp32 product of the dequantized operands (rel. error, expected ~ bf16 rounding).

Fail soft: without CUDA or without torch._scaled_grouped_mm, or when its first call on these shapes
is refused, the JSON says so ("available": false, "reason") and the exit status is 0.

usage: scaled_gmm_peer.py [--json PATH] [--tokens 1,8,...] [--quick] [--preset v4-flash|mini] [--no-graph]
"""
import argparse
import math
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_util import add_common_args, capture, err, reps_for, run, tokens, write_json  # noqa: E402


def log(*a):
    print("scaled_gmm_peer:", *a, flush=True)


def routed_counts(torch, torch_peer, shp, dev, T):
    """Token-slots per expert as the torch peer's router sends them at this T ([E] int64)."""
    g = torch.Generator(device=dev)
    g.manual_seed(1)  # torch_peer.Layer's seed: the gate and bias are its first two draws
    gate, bias = torch_peer.make_router(g, shp["E"], shp["H"], dev)
    x = torch_peer.make_x(T, shp["H"], dev, 1000 + T)
    idx, _ = torch_peer.route(x, gate.float(), bias, shp["K"], shp["route_scale"])
    return torch.bincount(idx.reshape(-1), minlength=shp["E"])


def balanced_counts(torch, E, S, dev):
    c = torch.full((E,), S // E, dtype=torch.int64)
    c[: S % E] += 1
    return c.to(dev)


def random_e4m3(torch, shape, g, dev):
    """N(0, 1) rounded to e4m3, generated in slices of dim 0 of about 1 GiB in fp32."""
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=dev)
    chunk = max(1, (1 << 28) // math.prod(shape[1:]))
    for i in range(0, shape[0], chunk):
        n = min(chunk, shape[0] - i)
        out[i:i + n] = torch.randn((n,) + tuple(shape[1:]), generator=g, device=dev).to(torch.float8_e4m3fn)
    return out


class Gemms:
    """The operands at the largest S, in the layouts torch._scaled_grouped_mm takes: A row-major
    [S, K] e4m3 with a [S] fp32 scale, B [E, K, N] column-major (a transposed [E, N, K] tensor) with an
    [E, N] fp32 scale, offs int32 [E] (end row of each group)."""

    def __init__(self, torch, shp, S_max, dev):
        self.torch = torch
        H, I, E = shp["H"], shp["I"], shp["E"]
        g = torch.Generator(device=dev)
        g.manual_seed(3)
        self.x = random_e4m3(torch, (S_max, H), g, dev)
        self.h = random_e4m3(torch, (S_max, I), g, dev)
        self.w13 = random_e4m3(torch, (E, 2 * I, H), g, dev)
        self.w2 = random_e4m3(torch, (E, H, I), g, dev)
        # rowwise scales (powers of two here: any fp32 works; the kernel reads one per row / column)
        self.sx = torch.full((S_max,), 2.0 ** -4, device=dev)
        self.sh = torch.full((S_max,), 2.0 ** -5, device=dev)
        self.s13 = torch.full((E, 2 * I), 2.0 ** -6, device=dev)
        self.s2 = torch.full((E, H), 2.0 ** -7, device=dev)

    def gate_up(self, S, offs):
        t = self.torch
        return t._scaled_grouped_mm(self.x[:S], self.w13.transpose(-2, -1), self.sx[:S], self.s13, offs=offs,
                                    out_dtype=t.bfloat16)

    def down(self, S, offs):
        t = self.torch
        return t._scaled_grouped_mm(self.h[:S], self.w2.transpose(-2, -1), self.sh[:S], self.s2, offs=offs,
                                    out_dtype=t.bfloat16)

    def check(self, S, offs, counts):
        """Both GEMMs of the first three non-empty groups against fp32 products of the dequantized operands."""
        gu, dn = self.gate_up(S, offs).float(), self.down(S, offs).float()
        ends = offs.tolist()
        worst = 0.0
        done = 0
        for e, c in enumerate(counts.tolist()):
            if c == 0 or done == 3:
                continue
            r = slice(ends[e] - c, ends[e])
            ref_gu = (self.x[r].float() * self.sx[r, None]) @ (self.w13[e].float() * self.s13[e][:, None]).t()
            ref_dn = (self.h[r].float() * self.sh[r, None]) @ (self.w2[e].float() * self.s2[e][:, None]).t()
            for got, ref in ((gu[r], ref_gu), (dn[r], ref_dn)):
                worst = max(worst, ((got - ref).norm() / ref.norm().clamp(min=1e-30)).item())
            done += 1
        return worst


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap, "out/bench/gmm_peer.json")
    args = ap.parse_args()
    Ts = tokens(args)
    out = {"available": False, "peer": "torch._scaled_grouped_mm, e4m3, rowwise fp32 scales, bf16 out: the routed "
           "experts' two grouped GEMMs only", "preset": args.preset, "runs": []}
    try:
        import torch
        out["torch"] = torch.__version__
    except Exception as ex:  # noqa: BLE001
        out["reason"] = f"no torch: {err(ex)}"
        write_json(args.json, out)
        log(out["reason"])
        return 0
    if not torch.cuda.is_available():
        out["reason"] = "no CUDA device"
    elif not hasattr(torch, "_scaled_grouped_mm"):
        out["reason"] = f"torch {torch.__version__} has no torch._scaled_grouped_mm"
    if "reason" in out:
        write_json(args.json, out)
        log(out["reason"])
        return 0
    try:
        return measure(args, Ts, out, torch)
    except Exception as ex:  # noqa: BLE001
        traceback.print_exc()
        out["available"] = False
        out["reason"] = f"failed: {err(ex)}"
        write_json(args.json, out)
        return 1


def measure(args, Ts, out, torch):
    import torch_peer

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # the router's fp32 logits, as in torch_peer
    shp = torch_peer.FLASH if args.preset == "v4-flash" else torch_peer.MINI
    H, I, E, K = shp["H"], shp["I"], shp["E"], shp["K"]
    out.update(shape=shp, device=torch.cuda.get_device_name())
    log(f"torch {torch.__version__}, {out['device']}, preset {args.preset}, T {Ts}")
    PAD = 16
    gm = Gemms(torch, shp, max(Ts) * K + PAD * E, dev)  # room for groups padded to PAD rows
    torch.cuda.synchronize()
    pad = False

    def layout(counts):
        """(rows the call spans, offs, per-group rows): the groups as routed, or each padded to PAD rows."""
        c = (counts + PAD - 1) // PAD * PAD if pad else counts
        return int(c.sum().item()), torch.cumsum(c, 0).to(torch.int32), c

    # does this torch take these shapes at all, and compute them right? Groups as routed first (any row
    # count, empty groups included), then padded to 16 rows each (as torchtitan feeds it); a refusal or
    # a wrong product of both is a finding: say it and exit 0
    T0 = 32 if 32 in Ts else Ts[0]
    c0 = routed_counts(torch, torch_peer, shp, dev, T0)
    refusals = []
    for pad in (False, True):
        try:
            S0, offs0, cp0 = layout(c0)
            rel = gm.check(S0, offs0, cp0)
            if not rel <= 2e-2:  # bf16 output rounding is ~2e-3; more is a wrong product, not a slow one
                raise ArithmeticError(f"results differ from the fp32 product by rel. error {rel:.3g}")
            out["checks"] = {"T": T0, "max_rel_err_vs_fp32": rel}
            break
        except Exception as ex:  # noqa: BLE001
            refusals.append(("padded to 16 rows: " if pad else "groups as routed: ") + err(ex))
            log("refused:", refusals[-1])
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a sticky device error: the next attempt says it again
                pass
    else:
        out["reason"] = "torch._scaled_grouped_mm refused or miscomputed these operands: " + "; ".join(refusals)
        write_json(args.json, out)
        log(out["reason"])
        return 0
    out["groups"] = ("padded to 16 rows each (TFLOP/s on the unpadded rows); as routed it said: " + refusals[0]) \
        if pad else "as routed (any row count, empty groups included)"
    log(f"check at T={T0}: max rel err vs fp32 product {out['checks']['max_rel_err_vs_fp32']:.2e}; groups {out['groups']}")

    use_graph = not args.no_graph
    graph_note = "ok" if use_graph else "not tried (--no-graph)"
    rows = []
    for T in Ts:
        S = T * K
        reps = reps_for(T, args.quick)
        row = {"tokens": T, "slots": S, "reps": reps, "dists": {}}
        for dist in ("routed", "balanced"):
            counts = routed_counts(torch, torch_peer, shp, dev, T) if dist == "routed" else balanced_counts(torch, E, S, dev)
            Sc, offs, _ = layout(counts)
            cl = counts.tolist()
            d = {"nonempty_experts": sum(1 for c in cl if c), "max_rows": max(cl), "min_rows": min(cl), "rows_called": Sc}
            try:
                d["gate_up_ms"], _ = torch_peer.time_fn(lambda: gm.gate_up(Sc, offs), reps)
                d["down_ms"], _ = torch_peer.time_fn(lambda: gm.down(Sc, offs), reps)
                d["pair_eager_ms"], d["pair_eager_min_ms"] = torch_peer.time_fn(
                    lambda: (gm.gate_up(Sc, offs), gm.down(Sc, offs)), reps)
            except Exception as ex:  # noqa: BLE001
                d["error"] = err(ex)
            if use_graph and "pair_eager_ms" in d:
                graph = None
                try:
                    graph = capture(torch, lambda: (gm.gate_up(Sc, offs), gm.down(Sc, offs)))
                    d["pair_graph_ms"], d["pair_graph_min_ms"] = torch_peer.time_fn(graph.replay, reps)
                except Exception as ex:  # noqa: BLE001
                    d["graph_error"] = err(ex)
                    graph_note = f"capture failed at T={T} ({dist}): {d['graph_error']}; later T eager only"
                    use_graph = False
                    log("graph:", graph_note)
                del graph
            timed = [d[k] for k in ("pair_eager_ms", "pair_graph_ms") if k in d]
            if timed:
                d["gemm_ms"] = min(timed)
                d["graph"] = d.get("pair_graph_ms", math.inf) <= d["pair_eager_ms"]
                d["tflops"] = 6.0 * S * H * I / (d["gemm_ms"] * 1e-3) / 1e12
            row["dists"][dist] = d
            torch.cuda.empty_cache()
        r = row["dists"]["routed"]
        row.update(gemm_ms=r.get("gemm_ms"), graph=r.get("graph", False), tflops=r.get("tflops"),
                   mode="graph" if r.get("graph") else ("eager" if r.get("gemm_ms") is not None else "failed"))
        rows.append(row)
        b = row["dists"]["balanced"]
        log(f"T={T:6d} S={S:6d} routed: {r.get('gemm_ms', float('nan')):.4f} ms ({r.get('tflops', float('nan')):.1f} "
            f"TFLOP/s, {r['nonempty_experts']} experts, max {r['max_rows']} rows)  balanced: "
            f"{b.get('gemm_ms', float('nan')):.4f} ms  {r.get('error', '')}{b.get('error', '')}")

    out.update(
        available=True,
        dist="routed: the SPEC router's counts on torch_peer's gate/bias and input x of each T (the table's); "
             "balanced: S/E rows per expert",
        timing="CUDA events, 3 warm-ups, median of reps; gemm_ms = gate/up + down back to back, the faster of eager "
               "and CUDA-graph replay; gate_up_ms / down_ms eager alone; use_fast_accum false",
        graph=graph_note,
        runs=rows,
    )
    write_json(args.json, out)
    print(f"{'T':>6} {'slots':>6} {'gemm ms':>9} {'mode':>6} {'TFLOP/s':>8} {'balanced ms':>12}")
    for r in rows:
        bal = r["dists"]["balanced"].get("gemm_ms")
        print(f"{r['tokens']:6d} {r['slots']:6d} {r['gemm_ms'] if r['gemm_ms'] is not None else float('nan'):9.4f} "
              f"{r['mode']:>6} {r['tflops'] or float('nan'):8.1f} {bal if bal is not None else float('nan'):12.4f}")
    log(f"wrote {args.json}")
    return 0 if all(r["gemm_ms"] is not None for r in rows) else 1


if __name__ == "__main__":
    run(main)
