#!/usr/bin/env python3
"""The HF transformers peer: transformers' own `DeepseekV4SparseMoeBlock` run the
way a user runs it, timed per T with CUDA events, eager and replayed from a CUDA graph.

What runs: `transformers.models.deepseek_v4.modeling_deepseek_v4.DeepseekV4SparseMoeBlock` (transformers
5.x, the device has 5.17) built from a `DeepseekV4Config` with the v4-flash MoE shape of core/config.c
set_flash, mapped to the HF config's names:
    H 4096            hidden_size
    I 2048            moe_intermediate_size (the shared expert's width too: intermediate_size maps to it)
    E 256, K 6        n_routed_experts, num_experts_per_tok
    1 shared expert   n_shared_experts
    route_scale 1.5   routed_scaling_factor (norm_topk_prob true: weights normalised, then scaled)
    swiglu_limit 10   swiglu_limit (gate clamped <= 10, up to [-10, 10], routed and shared)
    sqrt(softplus)    scoring_func "sqrtsoftplus"
    non-hash layer    layer_idx 5 (mlp_layer_types defaults to 3 hash_moe layers, then moe)
and `config._experts_implementation = "grouped_mm"` (the property transformers' `@use_experts_implementation`
reads at every forward; `from_pretrained(..., experts_implementation="grouped_mm")` sets the same), bf16
weights, as `from_pretrained(dtype=torch.bfloat16)` would leave them: every parameter bf16, the
selection bias `e_score_correction_bias` fp32 (`_keep_in_fp32_modules_strict`).

The weights are bench/torch_peer.py's (its Layer: the same generator, the same draws): routed experts
generated as fp4 codes with ue8m0 scales and dequantized to bf16 (gate_up_proj [E, 2I, H] = gate | up,
down_proj [E, H, I], the layouts both use), the shared expert's fp8 weights dequantized to bf16, the
gate and bias as drawn there; the input x of each T is torch_peer's make_x(T, H, seed 1000 + T). So the
routing is the torch peer's (HF computes bf16 logits, the torch peer fp32: a few top-K may differ).

Timing per T: 3 warm-ups, then CUDA events around each call, median of reps (min also kept); eager, then
the same call captured in a CUDA graph (side-stream warm-up, torch.cuda.graph) and replayed. A capture
that fails is reported with its reason in the JSON and the T keeps its eager time; after a failed
capture no further T is captured (the stream's state is not trusted again). ms = the graph time where
there is one, else eager; mode says which.

Fail soft: without a DeepseekV4 module in this transformers (or without transformers) the JSON says so
("available": false, "reason") and the exit status is 0. Without CUDA likewise, unless --device cpu
(a smoke test of the script itself on the mini preset: perf_counter timing, no graphs).

usage: hf_peer.py [--json PATH] [--tokens 1,8,...] [--quick] [--preset v4-flash|mini] [--no-graph]
                  [--device cuda|cpu]
"""
import argparse
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the device has no network; nothing here downloads
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_util import add_common_args, capture, err, reps_for, run, tokens, write_json  # noqa: E402

LAYER_IDX = 5  # non-hash with the default mlp_layer_types (bench_cuda times layer 5 too)


def log(*a):
    print("hf_peer:", *a, flush=True)


def hf_config(shp, DeepseekV4Config):
    """The HF config of one v4-flash MoE layer (SPEC keys -> HF names, see the module docstring)."""
    cfg = DeepseekV4Config(
        hidden_size=shp["H"],
        moe_intermediate_size=shp["I"],
        n_routed_experts=shp["E"],
        num_experts_per_tok=shp["K"],
        n_shared_experts=1,
        routed_scaling_factor=shp["route_scale"],
        swiglu_limit=shp["L"],
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        hidden_act="silu",
    )
    cfg._experts_implementation = "grouped_mm"
    return cfg


def build_block(shp, layer, dev, mods):
    """DeepseekV4SparseMoeBlock on the meta device, then every tensor replaced by torch_peer's."""
    import torch
    from torch import nn

    cfg = hf_config(shp, mods.DeepseekV4Config)
    if cfg.mlp_layer_types[LAYER_IDX] != "moe":
        raise RuntimeError(f"layer {LAYER_IDX} is {cfg.mlp_layer_types[LAYER_IDX]}, not a top-k moe layer")
    with torch.device("meta"):
        block = mods.DeepseekV4SparseMoeBlock(cfg, LAYER_IDX)
    if block.is_hash:
        raise RuntimeError("the block was built as a hash layer")
    I = shp["I"]

    def param(t):
        return nn.Parameter(t.contiguous(), requires_grad=False)

    block.gate.weight = param(layer.gate)                       # [E, H] bf16
    block.gate.e_score_correction_bias = layer.bias.float()     # buffer, fp32 as from_pretrained keeps it
    block.experts.gate_up_proj = param(layer.w13)               # [E, 2I, H] bf16, gate rows then up rows
    block.experts.down_proj = param(layer.w2)                   # [E, H, I] bf16
    block.shared_experts.gate_proj.weight = param(layer.s13_bf[:I])
    block.shared_experts.up_proj.weight = param(layer.s13_bf[I:])
    block.shared_experts.down_proj.weight = param(layer.s2_bf)
    left = [n for n, t in list(block.named_parameters()) + list(block.named_buffers()) if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"tensors of the HF block not set from the torch peer's layer: {left}")
    block.eval()
    return block, cfg


def timer(dev):
    if dev.type == "cuda":
        import torch_peer

        return torch_peer.time_fn

    def time_cpu(fn, reps, warm=3):
        for _ in range(warm):
            fn()
        t = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(t), min(t)

    return time_cpu


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap, "out/bench/hf_peer.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    Ts = tokens(args)
    out = {"available": False, "peer": "HF transformers DeepseekV4SparseMoeBlock, experts_implementation grouped_mm, bf16",
           "preset": args.preset, "layer_idx": LAYER_IDX, "runs": []}

    try:
        import torch
        out["torch"] = torch.__version__
    except Exception as ex:  # noqa: BLE001 - no torch is a finding, not a crash
        out["reason"] = f"no torch: {err(ex)}"
        write_json(args.json, out)
        log(out["reason"])
        return 0
    try:
        import transformers
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mods
        out["transformers"] = transformers.__version__
        _ = mods.DeepseekV4SparseMoeBlock, mods.DeepseekV4Config
    except Exception as ex:  # noqa: BLE001
        out["transformers"] = getattr(sys.modules.get("transformers"), "__version__", None)
        out["reason"] = f"transformers has no DeepseekV4 MoE block here: {err(ex)}"
        write_json(args.json, out)
        log(out["reason"])
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        out["reason"] = "no CUDA device"
        write_json(args.json, out)
        log(out["reason"])
        return 0

    try:
        return measure(args, Ts, out, torch, mods)
    except Exception as ex:  # noqa: BLE001 - say what broke in the JSON, then fail the step
        traceback.print_exc()
        out["available"] = False
        out["reason"] = f"failed: {err(ex)}"
        write_json(args.json, out)
        return 1


def measure(args, Ts, out, torch, mods):
    import torch_peer

    dev = torch.device(args.device)
    shp = torch_peer.FLASH if args.preset == "v4-flash" else torch_peer.MINI
    out["shape"] = shp
    out["device"] = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    log(f"torch {torch.__version__}, transformers {out['transformers']}, {out['device']}, preset {args.preset}, T {Ts}")
    t0 = time.time()
    layer = torch_peer.Layer(shp, dev)
    block, cfg = build_block(shp, layer, dev, mods)
    out["experts_implementation"] = cfg._experts_implementation
    try:  # the function @use_experts_implementation dispatches to for this config
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        out["experts_forward"] = ALL_EXPERTS_FUNCTIONS.get_interface(cfg._experts_implementation, None).__name__
    except Exception as ex:  # noqa: BLE001
        out["experts_forward"] = f"unknown ({err(ex)})"
    out["weights"] = ("bench/torch_peer.py's layer: routed fp4 dequantized to bf16, shared fp8 dequantized to bf16, "
                      "gate bf16, e_score_correction_bias fp32")
    log(f"block ready in {time.time() - t0:.1f} s: experts_implementation {cfg._experts_implementation}, "
        f"grouped_mm on this torch: {hasattr(torch.nn.functional, 'grouped_mm') or hasattr(torch, '_grouped_mm')}")
    H, I, K, E = shp["H"], shp["I"], shp["K"], shp["E"]
    time_fn = timer(dev)

    # the block against its own eager experts loop and against the torch peer, once, on fresh data
    checks = {}
    try:
        with torch.no_grad():
            x = torch_peer.make_x(32, H, dev, 7)
            y = block(x.view(1, 32, H)).view(32, H).float()
            cfg._experts_implementation = "eager"
            y_eager = block(x.view(1, 32, H)).view(32, H).float()
            cfg._experts_implementation = "grouped_mm"
            y_peer, idx_peer = layer.forward(x, "grouped")
            _, _, idx_hf = block.gate(x.view(1, 32, H))
            checks["grouped_mm_vs_eager_rel"] = ((y - y_eager).norm() / y_eager.norm()).item()
            checks["vs_torch_peer_rel"] = ((y - y_peer.float()).norm() / y_peer.float().norm()).item()
            same = (idx_hf.sort(dim=-1).values == idx_peer.sort(dim=-1).values).all(dim=-1)
            checks["topk_same_as_torch_peer_frac"] = same.float().mean().item()
            checks["finite"] = bool(torch.isfinite(y).all().item())
        log("checks at T=32:", ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in checks.items()))
    except Exception as ex:  # noqa: BLE001
        cfg._experts_implementation = "grouped_mm"
        checks["error"] = err(ex)
        log("check failed:", checks["error"])
    out["checks"] = checks

    use_graph = dev.type == "cuda" and not args.no_graph
    graph_note = "ok" if use_graph else ("not tried (--no-graph)" if args.no_graph else "not tried (cpu)")
    rows = []
    for T in Ts:
        row = {"tokens": T}
        reps = reps_for(T, args.quick)
        x3 = torch_peer.make_x(T, H, dev, 1000 + T).view(1, T, H)

        def fwd():
            return block(x3)

        with torch.no_grad():
            try:
                md, mn = time_fn(fwd, reps)
                row.update(eager_ms=md, eager_min_ms=mn, reps=reps)
            except Exception as ex:  # noqa: BLE001
                row["eager_error"] = err(ex)
            if use_graph and "eager_ms" in row:
                graph = None
                try:
                    graph = capture(torch, fwd)
                    md, mn = time_fn(graph.replay, reps)
                    row.update(graph_ms=md, graph_min_ms=mn)
                except Exception as ex:  # noqa: BLE001
                    row["graph_error"] = err(ex)
                    graph_note = f"capture failed at T={T}: {row['graph_error']}; later T eager only"
                    use_graph = False
                    log("graph:", graph_note)
                del graph
            elif "eager_ms" in row:
                row["graph_error"] = "not captured: " + graph_note
        row["graph"] = "graph_ms" in row
        row["ms"] = row.get("graph_ms", row.get("eager_ms"))
        row["mode"] = "graph" if row["graph"] else ("eager" if row["ms"] is not None else "failed")
        if row["ms"] is not None:
            flops = 2.0 * 3.0 * H * I * (T * K + T) + 2.0 * T * E * H
            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
        rows.append(row)
        log(f"T={T:6d} eager {row.get('eager_ms', float('nan')):.4f} ms  graph {row.get('graph_ms', float('nan')):.4f} ms"
            f"  {row.get('eager_error', '')}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    out.update(
        available=True,
        timing=("CUDA events around one block forward (router, grouped_mm experts, shared expert; bf16 in and out) "
                "3 warm-ups, median of reps; eager and CUDA-graph replay; ms = graph where captured, else eager")
        if dev.type == "cuda" else "perf_counter around one block forward (cpu smoke test), median of reps",
        graph=graph_note,
        runs=rows,
    )
    write_json(args.json, out)
    print(f"{'T':>6} {'eager ms':>9} {'graph ms':>9} {'TFLOP/s':>8}")
    for r in rows:
        def f(v):
            return f"{v:9.4f}" if isinstance(v, float) else f"{'-':>9}"
        print(f"{r['tokens']:6d} {f(r.get('eager_ms'))} {f(r.get('graph_ms'))} {r.get('tflops', float('nan')):8.1f}")
    log(f"wrote {args.json}")
    return 0 if all(r["ms"] is not None for r in rows) else 1


if __name__ == "__main__":
    run(main)
