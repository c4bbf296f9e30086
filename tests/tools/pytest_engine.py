"""Engine functions for the pytest plugin's CI test (dsv4moe.pytest_plugin, docs/engines.md): the
independent NumPy layer of indep_ref.py (no code shared with ref/) summing its experts in bf16, at
a rounding profile, with or without a defect of the detection table.

    pytest --dsv4moe-cases D --dsv4moe-engine pytest_engine:clean          # PYTHONPATH=tests/tools
"""
import numpy as np

import indep_ref


def _run(case, defect=None, rounding="spec"):
    cfg = dict(indep_ref.DEFAULTS)
    cfg.update(case.config_strings())
    st = indep_ref.read_st(case.model_path)
    y, ids, w = indep_ref.forward(cfg, st, case.x.astype(np.float32), case.input_ids.astype(np.int64),
                                  defect=defect, rounding=rounding, bf16_sums=True)
    return y, ids, w


def clean(case):
    return _run(case)


def bf16_ops(case):
    """An engine at the bf16_ops profile that says so in its result."""
    y, ids, w = _run(case, rounding="bf16_ops")
    return {"y": y, "topk_ids": ids, "topk_weights": w, "rounding": "bf16_ops"}


def fp32(case):
    return _run(case, rounding="fp32")


fp32.dsv4moe_rounding = "fp32"  # the profile where no --dsv4moe-rounding is given


def routed_clamp_dropped(case):
    return _run(case, defect="routed_clamp_dropped")


def y_only(case):
    return _run(case)[0]
