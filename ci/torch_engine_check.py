#!/usr/bin/env python3
"""A checkable engine with quantized activations (docs/engines.md, "Engines on the device"): the
DeepSeek-V4 MoE layer written in plain PyTorch the way bench/torch_peer.py writes it for speed,
reading exported cases (split layout), run on the device and held against dsv4moe's reference with
`dsv4moe check`; then the weight-point defect (and the two clamp defects) patched in must fail.

What it computes, per case (SPEC.md sections 2-5), as eager PyTorch on a bf16 model does (the
`bf16_ops` rounding profile of SPEC.md section 10, declared as the output's engine_rounding):
  router   logits in fp64 rounded to fp32, sqrt(softplus), top-K of score + bias (hash layers:
           tid2eid), weights normalised times route_scale;
  experts  weights dequantized once (e4m3 x 128x128 ue8m0, e2m1 x 1x32 ue8m0: exact in bf16);
           x quantized to e4m3 with 1x128 ue8m0 scales; g, u = bf16 GEMMs (fp32 accumulation,
           reduced-precision reductions off); clamp; silu(g), silu(g) u and h w each rounded to
           bf16; h quantized likewise; o = bf16 GEMM; y += o in fp32; the shared expert the same
           with weight 1; output bf16(y).
  --gemm fp8: the GEMMs of fp8-weight experts through torch._scaled_mm with blockwise scales
           (1x128 activations, 128x128 weights) on FP8 tensor cores, checked with `--fp8`
           (rule outside-fp8-mma), when this torch accepts that form.

usage: torch_engine_check.py --cli build/dsv4moe --work DIR [--device cuda] [--gemm bf16|fp8] [--json PATH]
Exit status: 0 when the clean engine passes every case and each defect fails check; 1 otherwise;
2 when torch or the device is missing.
"""
import argparse
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

# Quantized layers with power-of-two activation scales (where the weight point is a defect: with
# fp32 scales amax / 448 the quantization follows h w, docs/engines.md), hash layer 0 and layer 1.
SCENARIO = """# written by ci/torch_engine_check.py
name: torch
description: quantized cases for the checkable torch engine (ue8m0 activation scales)
defaults:
  preset: mini
  layer: 1
  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: cpu}
  tokens: [64]
  seed: 31
  checks: [numerics, clamp_exercised]
  expect: pass
axes:
  quant:
    - {routed_format: fp8, shared_format: fp8, weight_scale: ue8m0, act_quant: ue8m0}
    - {routed_format: fp4, shared_format: fp8, act_quant: ue8m0}
  layer: [0, 1]
cases:
  - name: after-w2                       # the official point's other side: weight after w2 is the model here
    config: {routed_format: fp8, shared_format: fp8, weight_scale: ue8m0, act_quant: ue8m0, weight_point: after_w2}
"""

DEFECTS = [
    ("weight_point_swapped", "the router weight applied at the other point (before/after w2 swapped)"),
    ("routed_clamp_dropped", "the routed experts' SwiGLU clamp dropped"),
    ("shared_clamp_dropped", "the shared expert's SwiGLU clamp dropped"),
]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class Engine:
    def __init__(self, torch, device, gemm):
        self.t, self.dev, self.gemm = torch, device, gemm
        self.layout = None  # the scale layouts this torch accepted, kept while they hold
        self.mm_fp8 = self.mm_fallback = 0  # fp8-weight GEMMs through _scaled_mm / dequantized
        self.mm_fp8_split = 0  # of mm_fp8's, those run per 128 output columns
        self.refusals = set()
        self.refused_shapes = set()  # (M, N, K) of the GEMMs no layout ran
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    # ---- SPEC.md section 5 ----
    def e8m0(self, raw):
        return self.t.exp2(self.t.from_numpy(raw.astype(np.float32) - 127.0))

    def weight(self, st, key):
        """(bf16 dequantized [N, K] on the device, fp8 codes, 128x128 fp32 scales or None)."""
        t = self.t
        dt, a = st[key + ".weight"]
        if dt == "BF16":
            w = t.from_numpy(a.view(np.int16).copy()).view(t.bfloat16)
            return w.to(self.dev), None, None
        sdt, s = st[key + ".scale"]
        scale = self.e8m0(s) if sdt == "F8_E8M0" else t.from_numpy(s.astype(np.float32))
        if dt == "F8_E4M3":
            q = t.from_numpy(a.copy()).view(t.float8_e4m3fn)
            N, K = q.shape
            full = scale.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
            w = (q.float() * full).to(t.bfloat16)
            return w.to(self.dev), q.to(self.dev), scale.to(self.dev)
        lut = t.tensor(E2M1)  # fp4: codes [N, K/2], low nibble the even k (e2m1 x 2^k: exact in bf16)
        codes = t.from_numpy(a.view(np.uint8).astype(np.int64))
        v = t.stack((lut[codes & 15], lut[codes >> 4]), -1).flatten(-2)
        w = (v * scale.repeat_interleave(32, 1)).to(t.bfloat16)
        return w.to(self.dev), None, None

    def act_quant(self, x):
        """x [M, K] -> (e4m3 codes, fp32 1x128 ue8m0 scales [M, K/128]): amax floored at 1e-4, the scale the
        least power of two >= amax / 448 (frexp in fp64: exact), q = e4m3(clamp(x / s))."""
        t = self.t
        M, K = x.shape
        g = x.float().view(M, K // 128, 128)
        ratio = g.abs().amax(-1).clamp(min=1e-4).double() / 448.0
        m, e = t.frexp(ratio)  # ratio = m 2^e, m in [0.5, 1)
        s = t.ldexp(t.ones_like(ratio), e - (m == 0.5).to(e.dtype)).float()
        q = (g / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(t.float8_e4m3fn)
        return q.view(M, K), s

    def qdq(self, x):
        q, s = self.act_quant(x)
        M, K = x.shape
        return (q.float().view(M, K // 128, 128) * s.unsqueeze(-1)).view(M, K).to(self.t.bfloat16)

    # (rows padded to a multiple of, activation-scale layout, weight-scale layout), in the order tried
    LAYOUTS = [(pad, i, j) for pad in (1, 16, 128) for i in range(2) for j in range(6)]

    def scale_form(self, s, ws, i, j):
        """The (scale_a, scale_b) layouts torch versions have asked of blockwise _scaled_mm: 1x128
        activation scales [M, K/128] outer-dim-major (stride(0) == 1, i = 0) or row-major (1); 128x128
        weight scales [K/128, N/128] as the transposed view (j = 0), contiguous (1), outer-dim-major
        (2), with rows (3) or columns (4) padded to 4, or [N/128, K/128] as stored (5)."""
        t = self.t
        sa = s.t().contiguous().t() if i == 0 else s.contiguous()
        b = ws.t()
        kb, nb = b.shape
        if j == 3:
            pad = t.zeros((kb, (nb + 3) // 4 * 4), dtype=b.dtype, device=b.device)
            pad[:, :nb] = b
            return sa, pad[:, :nb]
        if j == 4:
            padt = t.zeros((nb, (kb + 3) // 4 * 4), dtype=b.dtype, device=b.device)
            padt[:, :kb] = b.t()
            return sa, padt.t()[:kb]
        return sa, (b, b.contiguous(), b.t().contiguous().t(), None, None, ws.contiguous())[j]

    def linear(self, x, w, split=False):
        """bf16(x . W^T) for bf16 x: the quantize-dequantize GEMM, or FP8 _scaled_mm with blockwise scales.
        Every _scaled_mm product is held to the dequantized one (relative Frobenius difference < 1e-2: a
        scale read in the wrong layout is off by whole factors); the first layout that this torch accepts
        and that holds is kept; a product refused whole is tried per 128 output columns, and one no layout
        gets right is the dequantized GEMM, counted. split: a column block of such a product (None when
        refused)."""
        t = self.t
        wb, wq, ws = w
        ref = None
        if self.gemm == "fp8" and wq is not None and x.shape[0] > 0:
            q, s = self.act_quant(x)
            M, K = q.shape
            wqk, wsk = wq, ws
            if K == 128:
                # cuBLASLt's blockwise form refuses a single K block: one more block of zero codes
                # (scale 1) on both operands adds exactly nothing
                q = t.cat([q, t.zeros_like(q)], 1)
                s = t.cat([s, t.ones_like(s)], 1)
                wqk = t.cat([wq, t.zeros_like(wq)], 1)
                wsk = t.cat([ws, t.ones_like(ws)], 1)
            padded = {}  # rows padded with zeros (scale 1) to a multiple of pad, made when first tried
            for key in sorted(self.LAYOUTS, key=lambda k: k != self.layout):  # the one that held first
                pad, i, j = key
                if pad not in padded:
                    Mp = -(-M // pad) * pad
                    padded[pad] = (q, s) if Mp == M else (
                        t.cat([q, t.zeros((Mp - M, q.shape[1]), dtype=q.dtype, device=q.device)]),
                        t.cat([s, t.ones((Mp - M, s.shape[1]), dtype=s.dtype, device=s.device)]))
                qp, sp = padded[pad]
                sa, sb = self.scale_form(sp, wsk, i, j)
                try:
                    out = t._scaled_mm(qp, wqk.t(), scale_a=sa, scale_b=sb, out_dtype=t.bfloat16)[:M]
                except RuntimeError as e:
                    self.refusals.add(str(e).splitlines()[0][:120])
                    continue
                if ref is None:
                    ref = t.nn.functional.linear(self.qdq(x), wb)
                rf = ref.float()
                rel = ((out.float() - rf).norm() / rf.norm().clamp(min=1e-30)).item()
                if rel < 1e-2:
                    if self.layout != key:
                        print("torch-engine: _scaled_mm blockwise 1x128 x 128x128, rows padded to %d, scale layouts "
                              "%d, %d (M %d N %d K %d: relative difference to the dequantized product %.1e)"
                              % (key + (M, wq.shape[0], wq.shape[1], rel)))
                    self.layout = key
                    self.mm_fp8 += not split
                    return out
            if wq.shape[0] > 128 and not split:
                # cuBLASLt (torch 2.11, CUDA 13) finds no algorithm for some N > 128 blockwise products that
                # it runs per 128 output columns: the columns are independent, so the halves are the product
                parts = [self.linear(x, (wb[n:n + 128], wq[n:n + 128], ws[n // 128:n // 128 + 1]), split=True)
                         for n in range(0, wq.shape[0], 128)]
                if all(p_ is not None for p_ in parts):
                    self.mm_fp8_split += 1
                    return t.cat(parts, 1)
            if split:
                return None  # the caller falls back for the whole product
            self.mm_fallback += 1
            self.refused_shapes.add((M, wq.shape[0], wq.shape[1]))
        return ref if ref is not None else t.nn.functional.linear(self.qdq(x), wb)

    # ---- the layer ----
    def ffn(self, x, W, L, clamp, w, wp, defect):
        t = self.t
        g, u = self.linear(x, W[0]), self.linear(x, W[1])
        if clamp and L > 0:
            g, u = g.clamp(max=L), u.clamp(-L, L)
        h = t.nn.functional.silu(g) * u  # each a bf16 result (bf16_ops)
        before = (wp == "before_w2") != (defect == "weight_point_swapped")
        if w is not None and before:
            h = (h.float() * w[:, None]).to(t.bfloat16)
        o = self.linear(h, W[2])
        if w is not None and not before:
            o = (o.float() * w[:, None]).to(t.bfloat16)
        return o

    def forward(self, case, defect):
        t = self.t
        c = case.config_strings()
        H, E, K = int(c["dim"]), int(c["n_routed_experts"]), int(c["n_activated"])
        layer, nh = int(c["layer"]), int(c["n_hash_layers"])
        L, rs, wp = float(c["swiglu_limit"]), float(c["route_scale"]), c["weight_point"]
        assert c["score_func"] == "sqrtsoftplus" and c["gate_logits"] == "fp32" and float(c["top_p"]) == 1.0
        st = testing.read_safetensors(case.model_path)
        p = "layers.%d.ffn." % layer
        x = t.from_numpy(case.x_bits.view(np.int16).copy()).view(t.bfloat16).to(self.dev)
        T = x.shape[0]
        gate = self.weight(st, p + "gate")[0]
        logits = (x.double() @ gate.double().t()).float()
        s = t.sqrt(t.nn.functional.softplus(logits, threshold=20.0))
        if layer < nh:
            tid = t.from_numpy(st[p + "gate.tid2eid"][1].astype(np.int64)).to(self.dev)
            idx = tid[t.from_numpy(case.input_ids.astype(np.int64)).to(self.dev)]
        else:
            bias = t.from_numpy(st[p + "gate.bias"][1].astype(np.float32)).to(self.dev)
            idx = t.topk(s + bias, K, dim=-1, sorted=True).indices
        wts = s.gather(1, idx)
        wts = wts / wts.sum(-1, keepdim=True) * rs
        y = t.zeros(T, H, dtype=t.float32, device=self.dev)
        for e in range(E):
            rows, slots = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            W = [self.weight(st, p + "experts.%d.%s" % (e, k)) for k in ("w1", "w3", "w2")]
            o = self.ffn(x[rows], W, L, defect != "routed_clamp_dropped", wts[rows, slots], wp, defect)
            y.index_add_(0, rows, o.float())
        if int(c["n_shared_experts"]):
            W = [self.weight(st, p + "shared_experts." + k) for k in ("w1", "w3", "w2")]
            clamp = c["shared_clamp"] == "true" and defect != "shared_clamp_dropped"
            y += self.ffn(x, W, L, clamp, None, wp, None).float()
        return y.to(t.bfloat16), idx, wts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "dsv4moe"))
    ap.add_argument("--work", default="/tmp/dsv4-torch-engine")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gemm", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.cli = os.path.abspath(a.cli)
    try:
        import torch
    except ImportError as e:
        print("torch-engine: no torch here: %r" % (e,))
        return 2
    device = a.device if a.device != "cuda" or torch.cuda.is_available() else "cpu"
    eng = Engine(torch, torch.device(device), a.gemm)
    print("torch-engine: torch %s, device %s, gemm %s" % (torch.__version__, device, a.gemm))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    scn = os.path.join(a.work, "torch.yaml")
    with open(scn, "w") as f:
        f.write(SCENARIO)
    cases_dir = os.path.join(a.work, "cases")
    r = subprocess.run([a.cli, "export", scn, "--dir", cases_dir, "--rounding", "bf16_ops"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout.strip())
    if r.returncode:
        return 2
    cases = testing.cases(cases_dir)
    rows, ok, fp8 = [], True, []
    for defect, words in [(None, "clean")] + DEFECTS:
        out = os.path.join(a.work, "out-" + (defect or "clean"))
        for case in cases:
            y, idx, w = eng.forward(case, defect)
            bits = y.view(torch.int16).cpu().numpy().view(np.uint16)
            case.write_output(out, bits, idx.cpu().numpy(), w.float().cpu().numpy(),
                              engine="torch-%s%s" % (a.gemm, "+" + defect if defect else ""), rounding="bf16_ops")
        fp8 = ["--fp8"] if eng.mm_fp8 + eng.mm_fp8_split > 0 else []
        if a.gemm == "fp8" and defect is None:
            print("torch-engine: fp8-weight GEMMs: %d on _scaled_mm (%d of them per 128 output columns), "
                  "%d dequantized%s" % (eng.mm_fp8 + eng.mm_fp8_split, eng.mm_fp8_split, eng.mm_fallback, (" (M, N, K %s refused: %s)" % (
                    sorted(eng.refused_shapes)[:12], "; ".join(sorted(eng.refusals))))
                if eng.refusals and eng.mm_fallback else ""))
        r = subprocess.run([a.cli, "check", cases_dir, "--outputs", out, "--report",
                            os.path.join(a.work, "report-" + (defect or "clean"))] + fp8,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        failing = [ln.split(":")[0][6:] for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
        if defect is None:
            print(r.stdout)
            verdict = "pass" if r.returncode == 0 else "FAIL"
            ok &= r.returncode == 0
        else:
            verdict = "caught" if r.returncode == 1 else "missed"
            ok &= r.returncode == 1
        first = next((ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")), "")
        rows.append({"defect": defect or "clean", "what": words, "check_exit": r.returncode, "verdict": verdict,
                     "failing_cases": failing, "cases": len(cases), "first_failure": first[:400]})
    print("\ndetection table (torch engine, gemm %s%s, %d quantized cases, rounding bf16_ops)"
          % (a.gemm, " on FP8 tensor cores, rule outside-fp8-mma" if fp8 else "", len(cases)))
    print("%-22s %-5s %-8s %s" % ("defect", "exit", "verdict", "failing cases"))
    for r_ in rows:
        print("%-22s %-5d %-8s %d of %d" % (r_["defect"], r_["check_exit"], r_["verdict"], len(r_["failing_cases"]),
                                            r_["cases"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": device, "gemm": a.gemm,
                       "scaled_mm_gemms": eng.mm_fp8 + eng.mm_fp8_split,
                       "scaled_mm_split": eng.mm_fp8_split,
                       "dequantized_gemms": eng.mm_fallback, "scale_layouts": eng.layout, "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
