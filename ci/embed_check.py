#!/usr/bin/env python3
"""The device checks of the embedded fast path (docs/embedding.md): the fast path embedded through the Python
package (dsv4moe.Layer, the torch op torch.ops.dsv4moe.moe, dsv4moe.hf.patch) on one GPU.

usage: embed_check.py --cli build/cuda/dsv4moe --lib build/cuda/libdsv4moe.so --work DIR --json PATH
                      [--tokens 1,32,1024,16384] [--experts 32] [--quick] [--only CHECK,...]

Checks (each a row of the JSON, "ok" true or false with its numbers or its error):
  graph_capture      the layer (mini, layer 1, fp4) between torch ops, an RMSNorm before and a residual
                     add after, captured in torch.cuda.graph and replayed twice: bit-identical to eager
                     (y + residual, topk ids, topk weights), for T 1, 77, 300;
  shared_workspace   two layers (mini layer 1, then the hash layer 0 on its output) created on one caller
                     workspace (a torch uint8 tensor of the larger dsv4_backend_workspace_size) and run on
                     the current stream: bit-identical to the same layers with their own workspaces;
  bad_id_latched     a hash layer in a captured graph, an input id out of range written into the static
                     ids, replayed: poll_error raises status 6 naming input_ids[5], and a second poll is clean;
  examples           docs/examples/embed.c (build/cuda/embed_example) and docs/examples/embed.py on mini
                     layers 1 and 0: exit 0 and "served 3 steps";
  hf_bf16            (transformers with DeepseekV4) HF's block built by ci/hf_engine_check.py from a
                     generated mini-bf16 stacked checkpoint, run in fp32, against the same block patched
                     with formats bf16: SPEC.md section 9's outside-engine rule (testing.compare exact-quant);
                     hash layer 0 and layer 1;
  hf_fp4             the block patched with formats fp4 (routed fp4, shared fp8, ue8m0 activations, gemm fp8)
                     against `dsv4moe ref` on the checkpoint the patch wrote, with the patch's config: section
                     9's fp8 rule (fp8-mma);
  hf_ckpt            HF's block holding the quantized tensors of generated checkpoints as transformers holds
                     them after loading the official fp8/fp4 release without dequantize (its own modules where
                     this version has them: the finegrained family's FineGrainedExperts / FineGrainedLinear,
                     gate|up rows interleaved by its own Interleave op, or finegrained_fp8's FP8Experts /
                     FP8Linear; else a stand-in with the same names, dtypes and layout; the JSON's "held"
                     says which): mini (routed fp4, shared fp8, ue8m0) layers 1 and 0 and mini-fp8
                     (routed and shared fp8, fp32 scales) layer 1, patched with no formats: the patch's file holds
                     the checkpoint's exact bytes, y is within section 9's fp8 rule of `dsv4moe ref` on the
                     generated checkpoint with the patch's config, and patch(checkpoint=...) gives the same y
                     bit for bit;
  timing             bench/hf_peer.py's v4-flash-shaped block (E = --experts) unpatched (bf16, grouped_mm,
                     CUDA graph where it captures) next to the same block patched (fp4/fp8, gemm fp8, graph),
                     ms per call for each T.
Exit status: 0 every check passed (rows that cannot run here, such as HF without DeepseekV4, are
"skipped"), 1 a check failed, 2 no torch with CUDA (the device-check step is then absent).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, HERE)


def log(*a):
    print("embed:", *a, flush=True)


class Ctx:
    pass


def gen(ctx, preset, layer, tokens, layout="split"):
    out = os.path.join(ctx.work, "%s-l%d-%s-T%d" % (preset, layer, layout, tokens))
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        cmd = [ctx.cli, "gen", "--preset", preset, "--layer", str(layer), "--tokens", str(tokens), "--seed", "5",
               "--threads", "8", "--out", out]
        if layout == "stacked":
            cmd += ["--layout", "stacked", "--model-prefix"]
        subprocess.run(cmd, check=True, capture_output=True)
    return out


def side_warm_capture(torch, fn):
    """bench/peer_util.py's capture (two warm-ups on a side stream, then the capture); returns the graph
    and the captured call's outputs (the tensors a replay writes)."""
    import peer_util
    box = []
    graph = peer_util.capture(torch, lambda: box.append(fn()))
    return graph, box[-1]


def check_graph_capture(ctx, torch, dsv4moe):
    d = gen(ctx, "mini", 1, 4)
    rows = []
    with dsv4moe.Layer({"preset": "mini", "layer": 1}, os.path.join(d, "model.safetensors"), backend="cuda",
                       threads=8) as m:
        H = m.dim
        for T in (1, 77, 300):
            g = torch.Generator(device="cuda")
            g.manual_seed(T)
            x0 = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
            w = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).to(torch.bfloat16)

            def f(x):
                xf = x.float()
                h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
                y, ids, tw = m(h)
                return x + y, ids, tw

            eager = [t.clone() for t in f(x0)]
            torch.cuda.synchronize()
            xs = x0.clone()
            graph, outs = side_warm_capture(torch, lambda: f(xs))
            same = []
            for _ in range(2):
                for o in outs:
                    o.fill_(0)
                xs.copy_(x0)
                graph.replay()
                torch.cuda.synchronize()
                same.append(all(torch.equal(a, b) for a, b in zip(outs, eager)))
            m.poll_error(torch.cuda.current_stream())
            rows.append({"T": T, "replays_identical": same, "finite": bool(torch.isfinite(eager[0].float()).all())})
            log("graph_capture T %d: replays identical to eager %s" % (T, same))
    return all(all(r["replays_identical"]) and r["finite"] for r in rows), {"cases": rows}


def check_shared_workspace(ctx, torch, dsv4moe):
    T = 96
    da, db = gen(ctx, "mini", 1, 4), gen(ctx, "mini", 0, 4)
    pa, pb = os.path.join(da, "model.safetensors"), os.path.join(db, "model.safetensors")
    ca, cb = {"preset": "mini", "layer": 1}, {"preset": "mini", "layer": 0}
    with dsv4moe.Layer(ca, pa, backend="cuda", threads=8) as oa, dsv4moe.Layer(cb, pb, backend="cuda", threads=8) as ob:
        wbytes = max(oa.workspace_size(T), ob.workspace_size(T))
        ws = torch.empty(wbytes, dtype=torch.uint8, device="cuda")
        g = torch.Generator(device="cuda")
        g.manual_seed(7)
        x = torch.randn(T, oa.dim, device="cuda", generator=g).to(torch.bfloat16)
        vocab = int(ob.config_value("vocab_size"))
        ids = torch.randint(0, vocab, (T,), device="cuda", generator=g, dtype=torch.int64).to(torch.int32)
        ya, _, _ = oa(x)
        yb, _, _ = ob(ya, ids)
        with dsv4moe.Layer(ca, pa, backend="cuda", threads=8, workspace=(ws.data_ptr(), wbytes)) as sa, \
                dsv4moe.Layer(cb, pb, backend="cuda", threads=8, workspace=(ws.data_ptr(), wbytes)) as sb:
            za, _, _ = sa(x)
            zb, _, _ = sb(za, ids)
            torch.cuda.synchronize()
            sa.poll_error(torch.cuda.current_stream())
            sb.poll_error(torch.cuda.current_stream())
            same = [bool(torch.equal(ya, za)), bool(torch.equal(yb, zb))]
    log("shared_workspace: %d bytes for both layers, outputs identical to own workspaces %s" % (wbytes, same))
    return all(same), {"workspace_bytes": wbytes, "identical": same, "tokens": T}


def check_bad_id(ctx, torch, dsv4moe):
    T = 16
    d = gen(ctx, "mini", 0, 4)
    with dsv4moe.Layer({"preset": "mini", "layer": 0}, os.path.join(d, "model.safetensors"), backend="cuda",
                       threads=8) as m:
        vocab = int(m.config_value("vocab_size"))
        g = torch.Generator(device="cuda")
        g.manual_seed(3)
        xs = torch.randn(T, m.dim, device="cuda", generator=g).to(torch.bfloat16)
        ids = torch.randint(0, vocab, (T,), device="cuda", generator=g, dtype=torch.int64).to(torch.int32)
        graph, _ = side_warm_capture(torch, lambda: m(xs, ids))
        clean = m.poll_error(torch.cuda.current_stream())
        ids[5] = vocab + 3
        graph.replay()
        status, msg = None, ""
        try:
            m.poll_error(torch.cuda.current_stream())
        except dsv4moe.Error as e:
            status, msg = e.status, str(e)
        after = m.poll_error(torch.cuda.current_stream())
    ok = clean["bad_input_ids"] == 0 and status == 6 and "input_ids[5]" in msg and after["bad_input_ids"] == 0
    log("bad_id_latched: poll after replay -> status %s (%s); next poll %s" % (status, msg[:160], after))
    return ok, {"status": status, "message": msg, "next_poll": after}


def hf_setup():
    import hf_engine_check as hec
    version, mods, cfg_cls = hec.hf_classes()
    return hec, version, mods, cfg_cls


class GenCase:
    """What ci/hf_engine_check.py's load_block reads of an exported case, from a generated one."""

    def __init__(self, d, layer, dsv4moe, testing, preset="mini-bf16"):
        self.model_path = os.path.join(d, "model.safetensors")
        self.layer = layer
        self.preset = preset
        self.id = "gen-%s-l%d" % (preset, layer)
        with dsv4moe.Layer({"preset": preset, "layer": layer}, self.model_path, backend="ref") as m:
            keys = ("n_routed_experts", "n_activated", "dim", "moe_inter_dim", "n_layers", "layer", "n_hash_layers",
                    "route_scale", "score_func", "swiglu_limit", "vocab_size", "n_shared_experts")
            self.config = {k: m.config_value(k) for k in keys}
        inp = testing.read_safetensors(os.path.join(d, "input.safetensors"))
        self.x = testing.from_bf16_bits(inp["x"][1])
        self.input_ids = inp["input_ids"][1]
        self.input_path = os.path.join(d, "input.safetensors")
        self._testing = testing

    def weights(self):
        return self._testing.read_safetensors(self.model_path)


def hf_block_pair(ctx, torch, dsv4moe, testing, layer, hec, mods, cfg_cls):
    d = gen(ctx, "mini-bf16", layer, 48, layout="stacked")
    case = GenCase(d, layer, dsv4moe, testing)
    block, _ = hec.load_block(mods, cfg_cls, case, "cuda")
    block.config = hec.make_config(cfg_cls, case)
    block.dsv4moe_layer = layer
    x = torch.from_numpy(case.x).to("cuda", torch.float32)[None]
    ids = torch.from_numpy(case.input_ids.astype("int64")).to("cuda")[None]
    return case, block, x, ids


def check_hf(ctx, torch, dsv4moe, testing, formats):
    from dsv4moe import hf
    try:
        hec, version, mods, cfg_cls = hf_setup()
    except Exception as e:  # no transformers with DeepseekV4 here
        return None, {"skipped": "HF transformers' DeepseekV4SparseMoeBlock not available: %r" % (e,)}
    rows = []
    for layer in (0, 1):
        case, block, x, ids = hf_block_pair(ctx, torch, dsv4moe, testing, layer, hec, mods, cfg_cls)
        with torch.no_grad():
            y_hf = block(x, input_ids=ids)[0].float().cpu().numpy()
            hf.patch(block, gemm="fp8", formats=formats, workdir=os.path.join(ctx.work, "hf-%s-l%d" % (formats, layer)))
            y_p = block(x, input_ids=ids)[0].float().cpu().numpy()
        bits = testing.to_bf16_bits(y_p)
        if formats == "bf16":
            ok, why, met = testing.compare(bits, testing.to_bf16_bits(y_hf), rule="exact-quant")
            against = "HF block fp32 (eager experts)"
        else:
            ref = os.path.join(ctx.work, "hf-ref-l%d.safetensors" % layer)
            sets = []
            for k, v in block.dsv4moe_config.items():
                sets += ["--set", "%s=%s" % (k, str(v).lower() if isinstance(v, bool) else v)]
            subprocess.run([ctx.cli, "ref", "--preset", "mini-bf16", "--layer", str(layer), "--weights",
                            block.dsv4moe_checkpoint, "--input", case.input_path, "--out", ref, "--threads", "8"] + sets,
                           check=True, capture_output=True)
            ok, why, met = testing.compare(bits, testing.read_safetensors(ref)["y"][1], rule="fp8-mma")
            against = "dsv4moe ref on the patch's checkpoint and config"
        hf.unpatch(block)
        rows.append({"layer": layer, "ok": bool(ok), "why": why, "against": against,
                     "metrics": {k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in met.items()}})
        log("hf_%s layer %d: %s (%s) against %s" % (formats, layer, "pass" if ok else "FAIL", why, against))
    return all(r["ok"] for r in rows), {"transformers": version, "cases": rows}


def _torch_of(torch, entry):
    """A host torch tensor holding a (safetensors dtype, numpy array) entry's exact bytes."""
    import numpy as np
    dt, a = entry
    a = np.ascontiguousarray(a)
    views = {"BF16": ("int16", "bfloat16"), "F8_E4M3": ("uint8", "float8_e4m3fn"), "F8_E8M0": ("uint8", "float8_e8m0fnu")}
    if dt in views:
        raw, held = views[dt]
        return torch.from_numpy(a.view(getattr(np, raw))).view(getattr(torch, held))
    return torch.from_numpy(a)


def _hf_interleave(torch, t):
    """[gate; up] rows (dim 1) as HF's loader interleaves them (transformers' own Interleave op), or None
    when this transformers version has no such op."""
    try:
        from transformers.core_model_loading import Interleave
    except Exception:
        return None
    op = Interleave(dim=1, inverse=True)  # inverse=True: stacked -> interleaved (finegrained/conversions.py)
    held = t.dtype
    raw = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])  # moved as bits, any dtype
    try:
        out = op.convert({"t": raw}, None, ["t"])["t"]
    except TypeError:
        out = op.convert({"t": raw}, source_patterns=None, target_patterns=["t"])["t"]
    return out.view(held)


def held_block(torch, mods, cfg_cls, hec, case, src, dsv4moe_hf_layout):
    """An HF DeepseekV4SparseMoeBlock holding a split fp4/fp8 checkpoint's tensors the way HF holds them
    after from_pretrained without dequantize: its routed experts and shared linears replaced by
    transformers' own modules when this version has them (the finegrained family's FineGrainedExperts,
    mxfp4 or block-fp8, and FineGrainedLinear; else finegrained_fp8's FP8Experts, fp4 by
    config.expert_dtype, and FP8Linear), their allocations checked against the checkpoint's bytes and
    filled with them (experts stacked, gate|up rows interleaved by transformers' own Interleave where the
    module holds them interleaved); else by a stand-in with the same parameter names, dtypes and layout.
    Returns (block, how)."""
    from torch import nn
    import numpy as np
    layer = case.layer
    cfg = hec.make_config(cfg_cls, case)
    block = mods.DeepseekV4SparseMoeBlock(cfg, layer).to(torch.bfloat16)
    block.config = cfg
    block.dsv4moe_layer = layer
    E, H, I = int(case.config["n_routed_experts"]), int(case.config["dim"]), int(case.config["moe_inter_dim"])
    pre = "layers.%d.ffn." % layer
    stacked = dsv4moe_hf_layout.held_from_split(src, layer, E, interleaved=False)
    routed = "fp4" if src[pre + "experts.0.w1.weight"][0] in ("I8", "U8") else "fp8"
    scale_dt = src[pre + "shared_experts.w1.scale"][0]
    ue8m0 = scale_dt == "F8_E8M0"

    def param(t):
        return nn.Parameter(t.contiguous(), requires_grad=False)

    how = {}
    routed_ue8m0 = routed == "fp4" or src[pre + "experts.0.w1.scale"][0] == "F8_E8M0"
    sfmt = "ue8m0" if ue8m0 else "float"

    def shared_linears(make):  # make(in_features, out_features): the shared expert's gate, up and down
        return {p: make(H, I) if p != "down_proj" else make(I, H) for p in ("gate_proj", "up_proj", "down_proj")}

    experts = None
    tried = []
    try:  # the finegrained family (formats per module group)
        from transformers.integrations.finegrained import core as fg
        experts = fg.FineGrainedExperts(cfg, block_size=None if routed == "fp4" else (128, 128),
                                        scale_fmt="ue8m0" if routed_ue8m0 else "float",
                                        weight_format="mxfp4" if routed == "fp4" else "fp8")
        shared = shared_linears(lambda k, n: fg.FineGrainedLinear(in_features=k, out_features=n, block_size=(128, 128),
                                                                  scale_fmt=sfmt, weight_format="fp8"))
        how["modules"] = "transformers.integrations.finegrained FineGrainedExperts (%s) / FineGrainedLinear (fp8)" \
            % experts.weight_format
    except Exception as e:
        tried.append("finegrained: %r" % (e,))
        experts = None
    if experts is None:
        try:  # finegrained_fp8 (fp4 experts when config.expert_dtype == "fp4"; one scale_fmt for the model)
            from transformers.integrations import finegrained_fp8 as f8
            if routed_ue8m0 != ue8m0:
                raise RuntimeError("FP8Experts and FP8Linear share one scale_fmt; this checkpoint mixes them")
            cfg.expert_dtype = "fp4" if routed == "fp4" else "fp8"
            experts = f8.FP8Experts(cfg, block_size=(128, 128), activation_scheme="dynamic", scale_fmt=sfmt,
                                    has_bias=False, has_gate=True)
            shared = shared_linears(lambda k, n: f8.FP8Linear(in_features=k, out_features=n, block_size=(128, 128),
                                                              activation_scheme="dynamic", scale_fmt=sfmt,
                                                              has_bias=False))
            how["modules"] = "transformers.integrations.finegrained_fp8 FP8Experts (expert_dtype %s) / FP8Linear" \
                % cfg.expert_dtype
        except Exception as e:
            tried.append("finegrained_fp8: %r" % (e,))
            experts = None
    hf_modules = experts is not None
    if not hf_modules:  # a transformers without either: the stand-in, gate|up interleaved as the newest holds them
        experts, shared = block.experts, {p: getattr(block.shared_experts, p) for p in ("gate_proj", "up_proj", "down_proj")}
        experts.holds_interleaved_gate_up = True
        how["modules"] = "stand-in (%s)" % "; ".join(tried)
    interleaved = bool(getattr(experts, "holds_interleaved_gate_up", False))
    how["gate_up_rows"] = "interleaved" if interleaved else "stacked"
    for name in ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv"):
        t = _torch_of(torch, stacked["experts." + name])
        if interleaved and name.startswith("gate_up"):
            it = _hf_interleave(torch, t)
            if it is None:
                it = _torch_of(torch, dsv4moe_hf_layout.held_from_split(src, layer, E, interleaved=True)["experts." + name])
                how["interleave"] = "dsv4moe.hf_layout.held_from_split (no transformers Interleave)"
            else:
                how["interleave"] = "transformers.core_model_loading.Interleave"
            t = it
        old = getattr(experts, name, None) if hf_modules else None  # HF's own allocation must match the bytes
        if old is not None and (tuple(old.shape) != tuple(t.shape) or old.dtype != t.dtype):
            raise RuntimeError("HF's %s holds %s %s; the checkpoint gives %s %s"
                               % (name, old.dtype, list(old.shape), t.dtype, list(t.shape)))
        if hasattr(experts, name):
            delattr(experts, name)
        experts.register_parameter(name, param(t))
    block.experts = experts
    for p, proj in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        lin = shared[p]
        for name, key in (("weight", pre + "shared_experts.%s.weight" % proj),
                          ("weight_scale_inv", pre + "shared_experts.%s.scale" % proj)):
            t = _torch_of(torch, src[key])
            old = getattr(lin, name, None) if hf_modules else None
            if old is not None and (tuple(old.shape) != tuple(t.shape) or old.dtype != t.dtype):
                raise RuntimeError("HF's shared_experts.%s.%s holds %s %s; the checkpoint gives %s %s"
                                   % (p, name, old.dtype, list(old.shape), t.dtype, list(t.shape)))
            if hasattr(lin, name):
                delattr(lin, name)
            lin.register_parameter(name, param(t))
        setattr(block.shared_experts, p, lin)
    block.gate.weight = param(_torch_of(torch, src[pre + "gate.weight"]))
    if pre + "gate.tid2eid" in src:
        block.gate.tid2eid = torch.from_numpy(np.asarray(src[pre + "gate.tid2eid"][1]).astype(np.int64))
    else:
        block.gate.e_score_correction_bias = torch.from_numpy(np.ascontiguousarray(src[pre + "gate.bias"][1]))
    return block.to("cuda").eval(), how


def check_hf_ckpt(ctx, torch, dsv4moe, testing):
    """HF blocks holding the quantized tensors of generated fp4/fp8 checkpoints (mini: routed fp4 + shared
    fp8, ue8m0; mini-fp8: routed + shared fp8, fp32 scales), patched: the patch's file holds the
    checkpoint's bytes (layout only), the patched y is `dsv4moe ref`'s on the generated checkpoint with
    the patch's config within SPEC.md section 9's fp8 rule, and the same block patched with
    checkpoint= (the explicit-checkpoint path) gives the same y bit for bit."""
    from dsv4moe import hf, hf_layout
    try:
        hec, version, mods, cfg_cls = hf_setup()
    except Exception as e:
        return None, {"skipped": "HF transformers' DeepseekV4SparseMoeBlock not available: %r" % (e,)}
    rows = []
    for preset, layer in (("mini", 1), ("mini", 0), ("mini-fp8", 1)):
        d = gen(ctx, preset, layer, 48)
        case = GenCase(d, layer, dsv4moe, testing, preset=preset)
        src = testing.read_safetensors(case.model_path)
        src.pop("__metadata__", None)
        row = {"preset": preset, "layer": layer}
        try:
            block, how = held_block(torch, mods, cfg_cls, hec, case, src, hf_layout)
            row["held"] = how
            row["held_dtypes"] = {k: str(v.dtype) for k, v in block.state_dict().items()
                                  if k.startswith(("experts.", "shared_experts.gate_proj"))}
            x = torch.from_numpy(case.x).to("cuda", torch.bfloat16)[None]
            ids = torch.from_numpy(case.input_ids.astype("int64")).to("cuda")[None]
            work = os.path.join(ctx.work, "hf-ckpt-%s-l%d" % (preset, layer))
            with torch.no_grad():
                hf.patch(block, gemm="fp8", workdir=work)
                y = block(x, input_ids=ids)[0]
                torch.cuda.synchronize()
                block.dsv4moe_layer_obj.poll_error(torch.cuda.current_stream())
            conf = dict(block.dsv4moe_config)
            written = testing.read_safetensors(block.dsv4moe_checkpoint)
            written.pop("__metadata__", None)
            differ = [k for k, (dt, a) in written.items()
                      if k not in src or a.tobytes() != src[k][1].tobytes()]
            row["formats"] = {k: conf[k] for k in ("routed_format", "shared_format", "weight_scale", "act_quant")}
            row["bytes_identical"] = not differ and sorted(written) == sorted(src)
            row["tensors_differing"] = differ[:8]
            ref = os.path.join(work, "ref.safetensors")
            sets = []
            for k, v in conf.items():
                sets += ["--set", "%s=%s" % (k, str(v).lower() if isinstance(v, bool) else v)]
            r = subprocess.run([ctx.cli, "ref", "--preset", preset, "--layer", str(layer), "--weights", case.model_path,
                                "--input", case.input_path, "--out", ref, "--threads", "8"] + sets,
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError("dsv4moe ref exit %d: %s" % (r.returncode, r.stderr[-800:]))
            bits = testing.to_bf16_bits(y.float().cpu().numpy())
            ok, why, met = testing.compare(bits, testing.read_safetensors(ref)["y"][1], rule="fp8-mma")
            row.update(ok_fp8_rule=bool(ok), why=why,
                       metrics={k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in met.items()})
            hf.unpatch(block)
            with torch.no_grad():
                hf.patch(block, gemm="fp8", checkpoint=case.model_path)
                y2 = block(x, input_ids=ids)[0]
                torch.cuda.synchronize()
            row["explicit_checkpoint_identical"] = bool(torch.equal(y, y2))
            hf.unpatch(block)
            row["ok"] = bool(ok and row["bytes_identical"] and row["explicit_checkpoint_identical"])
        except Exception as e:
            row.update(ok=False, error=repr(e), traceback=traceback.format_exc()[-2500:])
        rows.append(row)
        log("hf_ckpt %s layer %d: %s (%s) bytes identical %s, explicit checkpoint identical %s, held %s"
            % (preset, layer, "pass" if row["ok"] else "FAIL", row.get("why") or row.get("error", ""),
               row.get("bytes_identical"), row.get("explicit_checkpoint_identical"), row.get("held")))
    return all(r["ok"] for r in rows), {"transformers": version, "cases": rows}


def check_timing(ctx, torch, dsv4moe, args):
    from dsv4moe import hf
    try:
        hec, version, mods, cfg_cls = hf_setup()
    except Exception as e:
        return None, {"skipped": "HF transformers' DeepseekV4SparseMoeBlock not available: %r" % (e,)}
    import hf_peer
    import torch_peer
    shp = dict(torch_peer.FLASH, E=int(args.experts))
    dev = torch.device("cuda")
    layer = torch_peer.Layer(shp, dev)
    block, cfg = hf_peer.build_block(shp, layer, dev, mods)
    block.config = cfg
    block.dsv4moe_layer = hf_peer.LAYER_IDX
    Ts = list(args.tokens)
    rows = {T: {"T": T} for T in Ts}

    def time_block(label):
        for T in Ts:
            x = torch_peer.make_x(T, shp["H"], dev, 1000 + T).to(torch.bfloat16)[None]
            reps = 5 if args.quick or T >= 4096 else 20
            fn = lambda: block(x)  # noqa: E731
            with torch.no_grad():
                try:
                    graph, _ = side_warm_capture(torch, fn)
                    ms, mn = torch_peer.time_fn(graph.replay, reps)
                    mode = "graph"
                except Exception as e:  # HF's grouped_mm path may not capture: its eager time then
                    torch.cuda.synchronize()
                    ms, mn = torch_peer.time_fn(fn, reps)
                    mode = "eager (capture failed: %s)" % str(e)[:120]
            rows[T][label] = {"ms": ms, "min_ms": mn, "mode": mode}
            log("timing %s T %d: %.3f ms (%s)" % (label, T, ms, mode))

    time_block("hf_bf16_grouped_mm")
    t0 = time.time()
    try:
        hf.patch(block, gemm="fp8", formats="fp4", max_tokens=max(Ts), workdir=os.path.join(ctx.work, "hf-timing"))
        patch_s = time.time() - t0
        time_block("dsv4moe_fp4_fp8gemm")
        block.dsv4moe_layer_obj.poll_error(torch.cuda.current_stream())
    except Exception as e:  # the HF rows measured so far stay in the JSON
        return False, {"error": repr(e), "traceback": traceback.format_exc()[-3000:], "transformers": version,
                       "rows": [rows[T] for T in Ts]}
    for r in rows.values():
        a, b = r.get("hf_bf16_grouped_mm"), r.get("dsv4moe_fp4_fp8gemm")
        if a and b and b["ms"] > 0:
            r["speedup"] = a["ms"] / b["ms"]
    return True, {"shape": {k: v for k, v in shp.items() if isinstance(v, (int, float, str))}, "patch_seconds": patch_s,
                  "transformers": version, "rows": [rows[T] for T in Ts]}


def check_examples(ctx, torch, dsv4moe):
    """docs/examples/embed.c (build/cuda/embed_example) and docs/examples/embed.py, on mini layers 0 and 1."""
    rows = []
    for layer in (1, 0):
        w = os.path.join(gen(ctx, "mini", layer, 4), "model.safetensors")
        for what, cmd in (("c", [os.path.join(os.path.dirname(ctx.cli), "embed_example"), "mini", str(layer), w]),
                          ("python", [sys.executable, os.path.join(ROOT, "docs", "examples", "embed.py"), "mini",
                                      str(layer), w])):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                               os.environ.get("PYTHONPATH", "")]))
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
            ok = r.returncode == 0 and "served 3 steps" in r.stdout
            rows.append({"example": what, "layer": layer, "ok": ok, "rc": r.returncode,
                         "output": (r.stdout + r.stderr)[-1500:]})
            log("example %s layer %d: rc %d %s" % (what, layer, r.returncode, r.stdout.strip().splitlines()[-1:]))
    return all(r["ok"] for r in rows), {"runs": rows}


CHECKS = ("graph_capture", "shared_workspace", "bad_id_latched", "examples", "hf_bf16", "hf_fp4", "hf_ckpt", "timing")


def token_list(text):
    """argparse type of --tokens: positive ints, comma-separated."""
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("%r: comma-separated positive token counts, e.g. 1,32,1024" % text) from None
    if not out or any(t < 1 for t in out):
        raise argparse.ArgumentTypeError("%r: comma-separated positive token counts, e.g. 1,32,1024" % text)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "cuda", "dsv4moe"))
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "cuda", "libdsv4moe.so"))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsv4-embed"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", default="1,32,1024,16384", type=token_list,
                    help="comma-separated token counts of the timing check")
    ap.add_argument("--experts", default=32, type=int, help="routed experts of the timing block (v4-flash: 256)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated check names (%s)" % ", ".join(CHECKS))
    args = ap.parse_args()
    only = [c for c in args.only.split(",") if c.strip()]
    unknown = [c for c in only if c.strip() not in CHECKS]
    if unknown:
        ap.error("--only %s: unknown check(s) %s; the checks are %s" % (args.only, ", ".join(unknown), ", ".join(CHECKS)))
    only = {c.strip() for c in only}
    os.environ.setdefault("DSV4MOE_LIB", args.lib)
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device")
    except Exception as e:
        print("embed: no torch with CUDA for %s: %r" % (sys.executable, e))
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"error": "no torch with CUDA for %s: %r" % (sys.executable, e), "checks": {}}, f, indent=1)
        return 2
    import dsv4moe
    from dsv4moe import testing
    os.makedirs(args.work, exist_ok=True)
    ctx = Ctx()
    ctx.cli, ctx.work = args.cli, args.work
    checks = [
        ("graph_capture", lambda: check_graph_capture(ctx, torch, dsv4moe)),
        ("shared_workspace", lambda: check_shared_workspace(ctx, torch, dsv4moe)),
        ("bad_id_latched", lambda: check_bad_id(ctx, torch, dsv4moe)),
        ("examples", lambda: check_examples(ctx, torch, dsv4moe)),
        ("hf_bf16", lambda: check_hf(ctx, torch, dsv4moe, testing, "bf16")),
        ("hf_fp4", lambda: check_hf(ctx, torch, dsv4moe, testing, "fp4")),
        ("hf_ckpt", lambda: check_hf_ckpt(ctx, torch, dsv4moe, testing)),
        ("timing", lambda: check_timing(ctx, torch, dsv4moe, args)),
    ]
    if [n for n, _ in checks] != list(CHECKS):
        raise SystemExit("embed_check.py: CHECKS and the check table disagree")
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "library": args.lib, "checks": {}}
    failed = False
    for name, fn in checks:
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            ok, detail = fn()
        except Exception as e:
            ok, detail = False, {"error": repr(e), "traceback": traceback.format_exc()[-3000:]}
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # a sticky CUDA error: the later checks report it too
                detail["cuda_after"] = repr(e2)
        verdict = "skipped" if ok is None else ("pass" if ok else "FAIL")
        failed |= ok is False
        res["checks"][name] = dict(detail, verdict=verdict, seconds=round(time.time() - t0, 2))
        print("embed %-17s %s" % (name, verdict), flush=True)
        if verdict == "FAIL" and "error" in detail:
            print(detail["traceback"], flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    t = res["checks"].get("timing", {})
    for r in t.get("rows", []):
        a, b = r.get("hf_bf16_grouped_mm", {}), r.get("dsv4moe_fp4_fp8gemm", {})
        print("embed timing T %6d: HF bf16 %9.3f ms  dsv4moe %9.3f ms  x%.2f" % (r["T"], a.get("ms", float("nan")),
              b.get("ms", float("nan")), r.get("speedup", float("nan"))))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
