#!/usr/bin/env python3
"""A worked example of verifying another engine (docs/engines.md): HF transformers'
DeepseekV4SparseMoeBlock, as a user runs it from a checkpoint, held against dsv4moe's reference
with `dsv4moe export` / `dsv4moe check`; then the same block with each defect of the detection
table patched in at run time must fail `check`.

usage: hf_engine_check.py --cli build/dsv4moe --work DIR [--device cuda] [--json PATH]

Steps:
  1. exports bf16 cases in the stacked layout (HF's key names, "model." prefix) with
     weight_point = after_w2 (HF multiplies the router weight after down_proj) and shared_clamp
     as this transformers version computes its shared expert (read from DeepseekV4MLP);
  2. for every case builds the block from a DeepseekV4Config with the case's dims, loads the
     case's model.safetensors by HF's own key names (strict: every key used, none missing), runs it
     in fp32 on the device, and writes y, topk_ids and topk_weights (the router's own outputs) as
     WORK/out-clean/<case>/output.safetensors; `dsv4moe check` must pass (exit 0);
  3. with each defect patched in (routed-expert clamp dropped; shared-expert clamp dropped;
     router weight applied before down_proj; a pruned top-p slot computed as expert 0; and, as an
     extra row, the router weight applied to the expert's input) the outputs go to
     WORK/out-<defect>/ and `dsv4moe check` must fail (exit 1);
  4. prints the detection table (and writes it as JSON).
Top-p: HF's block has no norm top-p; the cases with top_p < 1 run it through a wrapper of the
router that prunes as SPEC.md section 3 says (pruned slots get id E, which HF's experts skip).
Exit status: 0 when the clean run passes and every defect row that can show on bf16 layers is
caught (the weight-point row is reported, see docs/engines.md: on bf16 layers the two points differ
by rounding only), 1 otherwise, 2 when the engine cannot be set up (no transformers, no block).
"""
import argparse
import copy
import inspect
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

from dsv4moe import testing  # noqa: E402

# The matrix: mini layers in bf16 as HF computes them; shared_clamp is filled in at run time.
SCENARIO = """# written by ci/hf_engine_check.py
name: hf
description: bf16 cases for HF transformers' DeepseekV4SparseMoeBlock (weight after w2)
defaults:
  preset: mini-bf16
  layer: 1
  topology: {{world: 1, tp: 1, dp: 1, ep: 1, backend: cpu}}
  tokens: [48]
  seed: 21
  config: {{weight_point: after_w2, shared_clamp: {shared_clamp}}}
  checks: [numerics, clamp_exercised]
  expect: pass
axes:
  layer: [0, 1]                        # 0: the hash layer
  tokens: [[48], [7]]
cases:
  - name: topp                         # norm top-p (the router wrapper prunes, id E)
    preset: mini-topp
    config: {{routed_format: bf16, shared_format: bf16, act_quant: none, weight_point: after_w2,
             shared_clamp: {shared_clamp}, top_p: 0.6, top_p_predictor: none}}
  - name: topp-const
    preset: mini-topp
    layer: 1
    config: {{routed_format: bf16, shared_format: bf16, act_quant: none, weight_point: after_w2,
             shared_clamp: {shared_clamp}, top_p: 0.7, top_p_predictor: const}}
"""

EXPERTS_IMPL = "eager"
DTYPE = "float32"

DEFECTS = [
    ("routed_clamp_dropped", "the routed experts' SwiGLU clamp dropped (experts.limit = inf)", True),
    ("shared_clamp_dropped", "the shared expert's SwiGLU clamp dropped (shared_experts.limit = inf)", True),
    ("weight_before_w2", "the router weight applied before down_proj instead of after", False),
    ("topp_slot_as_expert0", "a pruned top-p slot computed as expert 0 with its weight", True),
    ("weight_on_input", "the router weight applied to the expert's input (extra row)", True),
]


def hf_classes():
    import torch  # noqa: F401
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    cfg_cls = getattr(transformers, "DeepseekV4Config", None) or getattr(m, "DeepseekV4Config")
    return transformers.__version__, m, cfg_cls


def shared_clamps(m):
    """Whether this version's DeepseekV4MLP clamps (read from its forward's source)."""
    try:
        return "clamp" in inspect.getsource(m.DeepseekV4MLP.forward)
    except (OSError, TypeError):
        return True


def make_config(cfg_cls, case):
    c = case.config
    cfg = cfg_cls()
    E, K, H, I = int(c["n_routed_experts"]), int(c["n_activated"]), int(c["dim"]), int(c["moe_inter_dim"])
    n_layers = max(int(c.get("n_layers", 2)), int(c["layer"]) + 1)
    n_hash = int(c["n_hash_layers"])
    values = {
        "hidden_size": H, "intermediate_size": I, "moe_intermediate_size": I, "num_local_experts": E,
        "n_routed_experts": E, "num_experts_per_tok": K, "routed_scaling_factor": float(c["route_scale"]),
        "scoring_func": c["score_func"], "swiglu_limit": float(c["swiglu_limit"]), "hidden_act": "silu",
        "mlp_bias": False, "vocab_size": int(c["vocab_size"]), "num_hash_layers": n_hash,
        "n_shared_experts": int(c["n_shared_experts"]), "num_hidden_layers": n_layers, "norm_topk_prob": True,
    }
    for k, v in values.items():
        setattr(cfg, k, v)
    if hasattr(cfg, "mlp_layer_types"):
        cfg.mlp_layer_types = ["hash_moe" if i < n_hash else "moe" for i in range(n_layers)]
    try:
        # the experts' own loop in fp32 (grouped_mm kernels want bf16); --experts-impl picks another
        cfg._experts_implementation = EXPERTS_IMPL
    except (AttributeError, ValueError, KeyError):
        pass
    return cfg


def load_block(m, cfg_cls, case, device):
    import torch
    block = m.DeepseekV4SparseMoeBlock(make_config(cfg_cls, case), case.layer).to(getattr(torch, DTYPE))
    prefix = "model.layers.%d.mlp." % case.layer
    sd, extra = {}, {}
    for k, (dt, a) in case.weights().items():
        if dt is None:
            continue
        if not k.startswith(prefix):
            raise SystemExit("unexpected key %s in %s" % (k, case.model_path))
        name = k[len(prefix):]
        arr = testing.from_bf16_bits(a) if dt == "BF16" else np.array(a)
        if name.startswith("norm_predictor."):
            extra[name] = arr  # SPEC.md's top-p predictor: not part of HF's block
            continue
        t = torch.from_numpy(np.ascontiguousarray(arr))
        sd[name] = t.long() if name.endswith("tid2eid") else t.float()  # load_state_dict casts to the block's dtype
    missing, unexpected = block.load_state_dict(sd, strict=False)
    # a buffer HF keeps that the layer's kind does not use (e.g. a bias of a hash router) may stay
    # at its initial value; anything else missing, or any key left over, is a loading defect
    bad_missing = [k for k in missing if not k.endswith("e_score_correction_bias")]
    if bad_missing or unexpected:
        raise SystemExit("%s: HF block keys missing %s, unexpected %s" % (case.id, bad_missing, unexpected))
    return block.to(device).eval(), extra


def prune_top_p(case, x, weights, indices, extra, defect, decide=None):
    """SPEC.md section 3 on the router's outputs (numpy, fp32 in the reference's order). decide: the
    fp32 router's weights of the same slots, when the block runs in bfloat16: the keep decision is made
    on them (SPEC.md section 3 prunes on fp32 scores; a bf16-rounded weight moves the cumulative
    threshold) and applied, with the renormalization, to the block's own weights."""
    c = case.config
    top_p = float(c["top_p"])
    E = int(c["n_routed_experts"])
    if top_p >= 1.0 or case.layer < int(c["n_hash_layers"]):
        return weights, indices
    w = weights.astype(np.float32).copy()
    wd = w if decide is None else decide.astype(np.float32)
    idx = indices.astype(np.int64).copy()
    T, K = idx.shape
    pred = c["top_p_predictor"]
    if pred == "none":
        nrm = np.ones((T, E), np.float32)
    elif pred == "const":
        nrm = np.broadcast_to(extra["norm_predictor.norm"].astype(np.float32), (T, E))
    else:
        P, p0 = extra["norm_predictor.weight"].astype(np.float64), extra["norm_predictor.bias"].astype(np.float32)
        nrm = np.maximum(np.float32(0), ((x.astype(np.float64) @ P.T).astype(np.float32) + p0).astype(np.float32))
    min_keep = int(c["top_p_min_keep"])
    renorm = bool(c["top_p_renorm"])
    for t in range(T):
        cj = (wd[t] * nrm[t, idx[t]]).astype(np.float32)
        order = sorted(range(K), key=lambda j: (-float(cj[j]), int(idx[t, j])))
        total = np.float32(0)
        for j in order:
            total = np.float32(total + cj[j])
        thr = np.float32(np.float32(top_p) * total)
        run, keep = np.float32(0), []
        for j in order:
            keep.append(j)
            run = np.float32(run + cj[j])
            if run >= thr and len(keep) >= min_keep:
                break
        osum = np.float32(0)
        ksum = np.float32(0)
        for j in range(K):
            osum = np.float32(osum + w[t, j])
            if j in keep:
                ksum = np.float32(ksum + w[t, j])
        for j in range(K):
            if j not in keep:
                if defect == "topp_slot_as_expert0":
                    idx[t, j] = 0  # the defect: computed as expert 0, its weight kept
                else:
                    idx[t, j], w[t, j] = E, 0
            elif renorm and ksum > 0:
                w[t, j] = np.float32(w[t, j] * np.float32(osum / ksum))
    return w, idx


def patch(block, defect):
    import torch
    import torch.nn.functional as F
    ex = block.experts
    if defect == "routed_clamp_dropped":
        if not hasattr(ex, "limit"):
            raise SystemExit("this transformers version keeps no experts.limit to patch")
        ex.limit = float("inf")
    elif defect == "shared_clamp_dropped":
        if not hasattr(block.shared_experts, "limit"):
            raise SystemExit("this transformers version keeps no shared_experts.limit to patch")
        block.shared_experts.limit = float("inf")
    elif defect in ("weight_before_w2", "weight_on_input"):
        def gate_act(gate_up):
            if hasattr(ex, "_apply_gate"):
                return ex._apply_gate(gate_up)
            gate, up = gate_up.chunk(2, dim=-1)  # the clamp and SiLU as HF's experts apply them
            return ex.act_fn(gate.clamp(max=ex.limit)) * up.clamp(min=-ex.limit, max=ex.limit)

        def forward(hidden_states, top_k_index, top_k_weights):
            final = torch.zeros_like(hidden_states)
            for e in range(ex.num_experts):
                tok, pos = torch.where(top_k_index == e)
                if tok.numel() == 0:
                    continue
                w = top_k_weights[tok, pos, None].to(hidden_states.dtype)
                xin = hidden_states[tok] * w if defect == "weight_on_input" else hidden_states[tok]
                h = gate_act(F.linear(xin, ex.gate_up_proj[e]))
                if defect == "weight_before_w2":
                    h = h * w
                final.index_add_(0, tok, F.linear(h, ex.down_proj[e]).to(final.dtype))
            return final
        ex.forward = forward


def run_case(m, cfg_cls, case, device, defect, out_dir):
    import torch
    block, extra = load_block(m, cfg_cls, case, device)
    if defect:
        patch(block, defect)
    captured = {}
    gate_forward = block.gate.forward
    x_np = case.x.astype(np.float32)

    gate32 = None
    if DTYPE != "float32" and float(case.config["top_p"]) < 1.0:
        gate32 = copy.deepcopy(block.gate).float()

    def gate(*args, **kw):
        logits, weights, indices = gate_forward(*args, **kw)
        decide = None
        if gate32 is not None:
            up = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
            _, w32, i32 = gate32(*up, **{k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v)
                                          for k, v in kw.items()})
            i32, w32 = i32.detach().cpu().numpy(), w32.detach().float().cpu().numpy()
            ib = indices.detach().cpu().numpy()
            # the fp32 router's weight of each of the block's slots, matched by expert id (topk's slot
            # order is free); a token where the two chose other experts keeps the block's own weights
            decide = weights.detach().float().cpu().numpy().copy()
            for t_ in range(ib.shape[0]):
                by_id = dict(zip(i32[t_].tolist(), w32[t_].tolist()))
                if sorted(by_id) == sorted(ib[t_].tolist()):
                    decide[t_] = [by_id[e] for e in ib[t_].tolist()]
                else:
                    captured["decide_mismatch"] = True
        w, idx = prune_top_p(case, x_np, weights.detach().float().cpu().numpy(),
                             indices.detach().cpu().numpy(), extra, defect, decide)
        captured["w"], captured["idx"] = w, idx
        # HF's experts index one_hot(num_experts) by the ids: a pruned slot's sentinel E would be out
        # of range (the device asserts), so the block gets the slot's own expert with weight 0,
        # which adds exactly nothing; the outputs written keep the sentinel
        E = int(case.config["n_routed_experts"])
        idx_hf = np.where(idx == E, indices.detach().cpu().numpy().astype(idx.dtype), idx)
        return logits, torch.from_numpy(w).to(weights.device, weights.dtype), torch.from_numpy(idx_hf).to(indices.device)

    block.gate.forward = gate
    x = torch.from_numpy(x_np).to(device=device, dtype=getattr(torch, DTYPE))[None]
    ids = torch.from_numpy(case.input_ids.astype(np.int64)).to(device)[None]
    with torch.no_grad():
        if case.tokens == 0:
            y = torch.zeros((1, 0, x.shape[-1]), device=device)
            captured.setdefault("w", np.zeros((0, int(case.config["n_activated"])), np.float32))
            captured.setdefault("idx", np.zeros((0, int(case.config["n_activated"])), np.int64))
        else:
            try:
                y = block(x, input_ids=ids)
            except TypeError:
                y = block(x) if not block.is_hash else block(x, ids)
    # the block's rounding profile (SPEC.md section 10): eager PyTorch in bfloat16 rounds every
    # elementwise result, in float32 none before the final bf16
    if defect is None and case.tokens:
        # how far the block's own router weights lie from the reference's, matched by expert id
        exp = case.expected
        ei, ew = exp["topk_ids"], exp["topk_weights"]
        rel = 0.0
        for t_ in range(ei.shape[0]):
            ref = {int(e): float(v) for e, v in zip(ei[t_], ew[t_])}
            for e, v in zip(captured["idx"][t_], captured["w"][t_]):
                if int(e) in ref and ref[int(e)] != 0:
                    rel = max(rel, abs(float(v) - ref[int(e)]) / abs(ref[int(e)]))
        print("hf-engine: %s: router weights within %.3g relative of the reference's%s" % (
            case.id, rel, "; the fp32 router chose other slots, the block's own weights decided top-p"
            if captured.get("decide_mismatch") else ""))
    case.write_output(out_dir, y[0].float().cpu().numpy(), captured["idx"], captured["w"],
                      engine="hf-transformers" + ("+" + defect if defect else ""),
                      rounding="fp32" if DTYPE == "float32" else "bf16_ops")


def check(cli, cases_dir, out_dir, report):
    r = subprocess.run([cli, "check", cases_dir, "--outputs", out_dir, "--report", report],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "dsv4moe"))
    ap.add_argument("--work", default="/tmp/dsv4-hf-engine")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    ap.add_argument("--experts-impl", default="eager", help="HF's experts implementation (eager, grouped_mm, ...)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the block's dtype (float32: as SPEC.md section 9 measured it)")
    a = ap.parse_args()
    a.cli = os.path.abspath(a.cli)  # the steps run in other folders
    global EXPERTS_IMPL, DTYPE
    EXPERTS_IMPL = a.experts_impl
    DTYPE = a.dtype
    try:
        version, m, cfg_cls = hf_classes()
    except Exception as e:  # no torch / transformers / DeepseekV4 in this environment
        print("hf-engine: cannot set up HF transformers' DeepseekV4SparseMoeBlock: %r" % (e,))
        return 2
    import torch
    device = a.device if a.device != "cuda" or torch.cuda.is_available() else "cpu"
    sc = shared_clamps(m)
    print("hf-engine: transformers %s, torch %s, device %s, %s, experts %s; DeepseekV4MLP clamps the shared "
          "expert: %s" % (version, torch.__version__, device, DTYPE, EXPERTS_IMPL, sc))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    scn = os.path.join(a.work, "hf.yaml")
    with open(scn, "w") as f:
        f.write(SCENARIO.format(shared_clamp="true" if sc else "false"))
    cases_dir = os.path.join(a.work, "cases")
    r = subprocess.run([a.cli, "export", scn, "--dir", cases_dir, "--layout", "stacked"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout.strip())
    if r.returncode:
        return 2
    cases = testing.cases(cases_dir)
    rows, ok = [], True
    for defect, words, must in [(None, "clean", True)] + DEFECTS:
        out = os.path.join(a.work, "out-" + (defect or "clean"))
        for case in cases:
            run_case(m, cfg_cls, case, device, defect, out)
        rc, text = check(a.cli, cases_dir, out, os.path.join(a.work, "report-" + (defect or "clean")))
        failing = [ln.split(":")[0][6:] for ln in text.splitlines() if ln.startswith("FAIL")]
        first = next((ln for ln in text.splitlines() if ln.startswith("FAIL")), "")
        if defect is None:
            print(text)
            verdict = "pass" if rc == 0 else "FAIL"
            ok &= rc == 0
        else:
            caught = rc == 1
            verdict = "caught" if caught else "missed"
            ok &= caught or not must
        rows.append({"defect": defect or "clean", "what": words, "check_exit": rc, "verdict": verdict,
                     "failing_cases": failing, "cases": len(cases), "first_failure": first[:400]})
    print("\ndetection table (HF transformers %s, %d bf16 cases, weight after w2)" % (version, len(cases)))
    print("%-22s %-7s %-10s %s" % ("defect", "exit", "verdict", "failing cases"))
    for r in rows:
        print("%-22s %-7d %-10s %d of %d" % (r["defect"], r["check_exit"], r["verdict"], len(r["failing_cases"]),
                                             r["cases"]))
    print("(weight_before_w2: on bf16 layers before and after down_proj differ by rounding only, below the"
          " tolerance a correct outside engine needs; it shows on fp8/fp4 layers, docs/engines.md)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"transformers": version, "torch": torch.__version__, "device": device,
                       "shared_clamp": sc, "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
