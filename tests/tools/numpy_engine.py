#!/usr/bin/env python3
"""An outside engine for the CI test of `dsv4moe export` / `check` (docs/engines.md): the independent
NumPy layer of indep_ref.py (written from SPEC.md, no code shared with ref/) run over exported case
folders, optionally with one defect patched in.

usage: numpy_engine.py CASES OUTPUTS [--defect NAME] [--no-routing] [--sentinel E|-1]
                       [--slot-order reversed] [--rounding spec|bf16_ops|fp32] [--no-declare] [--check]
Writes OUTPUTS/<case-id>/output.safetensors (y BF16, topk_ids I32, topk_weights F32). --rounding runs
the layer at that rounding profile of SPEC.md section 10 (an engine that rounds like eager PyTorch on a
bf16 model, or one in fp32) and records it as the metadata engine_rounding unless --no-declare. With
--check, also holds each output against its case with dsv4moe.testing (exit 1 when some case fails).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import indep_ref  # noqa: E402
from dsv4moe import testing  # noqa: E402


# Defects of the engine rather than of the layer's arithmetic.
ENGINE_DEFECTS = ("workspace_wrong_dim", "padding_leaks")


def workspace_bytes(cfg, ids, T, defect):
    """The peak workspace this engine reports: what it would allocate as a grouped-GEMM engine, each
    expert's token rows padded to 128 (the shared expert's T rows too), a row holding H fp8 activations
    with an fp32 scale per 128, I bf16 intermediates and H bf16 outputs, plus y in fp32. The defect
    workspace_wrong_dim sizes it on the wrong dimension, 9 times too large (aiconfigurator 1055,
    FlashInfer 4916)."""
    H, I, E = int(cfg["dim"]), int(cfg["moe_inter_dim"]), int(cfg["n_routed_experts"])
    kept = ids[(ids >= 0) & (ids < E)].ravel()
    counts = np.bincount(kept, minlength=E) if kept.size else np.zeros(E, dtype=np.int64)
    rows = int(np.sum((counts + 127) // 128 * 128))
    if int(cfg["n_shared_experts"]) and T:
        rows += (T + 127) // 128 * 128
    size = rows * (H + 4 * ((H + 127) // 128) + 2 * I + 2 * H) + T * H * 4
    return size * 9 if defect == "workspace_wrong_dim" else size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("outputs")
    ap.add_argument("--defect", choices=indep_ref.DEFECTS + ENGINE_DEFECTS + ("none",), help="none: the engine clean")
    ap.add_argument("--no-workspace", action="store_true", help="leave peak_workspace_bytes out of the metadata")
    ap.add_argument("--no-routing", action="store_true", help="write y only")
    ap.add_argument("--sentinel", default="E", choices=["E", "-1"])
    ap.add_argument("--slot-order", default="ref", choices=["ref", "reversed"],
                    help="reversed: every token's slots in the opposite order (an engine's freedom)")
    ap.add_argument("--rounding", default="spec", choices=indep_ref.ROUNDINGS)
    ap.add_argument("--no-declare", action="store_true", help="leave engine_rounding out of the metadata")
    ap.add_argument("--bf16-sums", action="store_true",
                    help="sum the experts' outputs in bf16 (the rounding SPEC.md 10.2's S term absorbs)")
    ap.add_argument("--weights-off", type=float, default=0.0,
                    help="the router weights this much relative off (a router run in bf16: up to about 1.4 %%)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    a.defect = None if a.defect == "none" else a.defect
    worst = 0
    for case in testing.cases(a.cases):
        if case.layout != "split":
            print("skip %s: the NumPy engine reads the split layout" % case.id)
            continue
        cfg = dict(indep_ref.DEFAULTS)
        cfg.update(case.config_strings())
        st = indep_ref.read_st(case.model_path)
        layer_defect = a.defect if a.defect in indep_ref.DEFECTS else None
        tp = case.meta.get("topology", {}).get("tp", 1) if isinstance(case.meta.get("topology"), dict) else 1
        if layer_defect == "fp4_scales_misaligned_tp" and tp != 2:
            layer_defect = None  # a tensor-parallel engine's defect: only where the case runs two shards
        x, in_ids = case.x.astype(np.float32), case.input_ids.astype(np.int64)
        if case.bucket is not None:  # a padded case: the whole bucket in one batch, the padding's ids masked
            x, in_ids = case.x_padded.astype(np.float32), case.input_ids_padded.astype(np.int64)
            V = int(cfg.get("vocab_size", 0)) or int(in_ids[:case.tokens].max(initial=0)) + 1
            safe = np.where((in_ids >= 0) & (in_ids < V), in_ids, 0)
        with np.errstate(invalid="ignore", over="ignore"):
            y, ids, w = indep_ref.forward(cfg, st, x, safe if case.bucket is not None else in_ids,
                                          defect=layer_defect, rounding=a.rounding, bf16_sums=a.bf16_sums)
        if a.defect == "padding_leaks" and case.bucket is not None:
            # a padding row whose id is -1 used as an index: its output lands on the last row of the
            # tokens (vLLM 51593 read the padding slot as UINT_MAX)
            for r in range(case.tokens, case.bucket):
                if in_ids[r] == -1 and case.tokens:
                    y[case.tokens - 1] = indep_ref.bf16(y[case.tokens - 1] + y[r])
        ws = None if a.no_workspace else workspace_bytes(cfg, ids, len(x), a.defect)
        E = int(cfg["n_routed_experts"])
        w = (w.astype(np.float64) * (1.0 + a.weights_off)).astype(np.float32) if a.weights_off else w
        if a.sentinel == "-1":
            ids = np.where(ids == E, -1, ids)
        if a.slot_order == "reversed":
            ids, w = ids[:, ::-1], w[:, ::-1]
        bits = testing.to_bf16_bits(y)
        kw = {} if a.no_routing else {"topk_ids": ids, "topk_weights": w}
        name = "numpy-indep" + ("-" + a.rounding if a.rounding != "spec" else "") + \
            ("-bf16sums" if a.bf16_sums else "") + ("+" + a.defect if a.defect else "")
        case.write_output(a.outputs, bits, engine=name, rounding=None if a.no_declare else a.rounding,
                          peak_workspace_bytes=ws, **kw)
        if a.check:
            v = case.check(bits, sentinel=a.sentinel, raise_on_failure=False, rounding=a.rounding,
                           peak_workspace_bytes=ws, **kw)
            print(v.line)
            worst = max(worst, 0 if v.ok else 1)
    return worst


if __name__ == "__main__":
    sys.exit(main())
