#!/usr/bin/env python3
"""An outside engine for the CI test of `dsv4moe export` / `check` (docs/engines.md): the independent
NumPy layer of indep_ref.py (written from SPEC.md, no code shared with ref/) run over exported case
folders, optionally with one defect patched in.

usage: numpy_engine.py CASES OUTPUTS [--defect NAME] [--no-routing] [--sentinel E|-1]
                       [--slot-order reversed] [--weights-f64] [--check]
Writes OUTPUTS/<case-id>/output.safetensors (y BF16, topk_ids I32, topk_weights F32). With --check,
also holds each output against its case with dsv4moe.testing (exit 1 when some case fails).
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("outputs")
    ap.add_argument("--defect", choices=indep_ref.DEFECTS)
    ap.add_argument("--no-routing", action="store_true", help="write y only")
    ap.add_argument("--sentinel", default="E", choices=["E", "-1"])
    ap.add_argument("--slot-order", default="ref", choices=["ref", "reversed"],
                    help="reversed: every token's slots in the opposite order (an engine's freedom)")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    worst = 0
    for case in testing.cases(a.cases):
        if case.layout != "split":
            print("skip %s: the NumPy engine reads the split layout" % case.id)
            continue
        cfg = dict(indep_ref.DEFAULTS)
        cfg.update(case.config_strings())
        st = indep_ref.read_st(case.model_path)
        y, ids, w = indep_ref.forward(cfg, st, case.x.astype(np.float32), case.input_ids.astype(np.int64),
                                      defect=a.defect)
        E = int(cfg["n_routed_experts"])
        if a.sentinel == "-1":
            ids = np.where(ids == E, -1, ids)
        if a.slot_order == "reversed":
            ids, w = ids[:, ::-1], w[:, ::-1]
        bits = testing.to_bf16_bits(y)
        kw = {} if a.no_routing else {"topk_ids": ids, "topk_weights": w}
        case.write_output(a.outputs, bits, engine="numpy-indep" + ("+" + a.defect if a.defect else ""), **kw)
        if a.check:
            v = case.check(bits, sentinel=a.sentinel, raise_on_failure=False, **kw)
            print(v.line)
            worst = max(worst, 0 if v.ok else 1)
    return worst


if __name__ == "__main__":
    sys.exit(main())
