#!/usr/bin/env python3
"""The device checks of issue 20 (docs/embedding.md): the fast path embedded through the Python
package (dsv4moe.Layer, the torch op torch.ops.dsv4moe.moe, dsv4moe.hf.patch) on one GPU.

usage: embed_check.py --cli build/cuda/dsv4moe --lib build/cuda/libdsv4moe.so --work DIR --json PATH
                      [--tokens 1,32,1024,16384] [--experts 32] [--quick]

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

    def __init__(self, d, layer, dsv4moe, testing):
        self.model_path = os.path.join(d, "model.safetensors")
        self.layer = layer
        self.id = "gen-l%d" % layer
        with dsv4moe.Layer({"preset": "mini-bf16", "layer": layer}, self.model_path, backend="ref") as m:
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
    Ts = [int(t) for t in args.tokens.split(",")]
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
    hf.patch(block, gemm="fp8", formats="fp4", max_tokens=max(Ts), workdir=os.path.join(ctx.work, "hf-timing"))
    patch_s = time.time() - t0
    time_block("dsv4moe_fp4_fp8gemm")
    block.dsv4moe_layer_obj.poll_error(torch.cuda.current_stream())
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "cuda", "dsv4moe"))
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "cuda", "libdsv4moe.so"))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsv4-embed"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", default="1,32,1024,16384")
    ap.add_argument("--experts", default=32, type=int, help="routed experts of the timing block (v4-flash: 256)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated check names")
    args = ap.parse_args()
    os.environ.setdefault("DSV4MOE_LIB", args.lib)
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device")
    except Exception as e:
        print("embed: no torch with CUDA for %s: %r" % (sys.executable, e))
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
        ("timing", lambda: check_timing(ctx, torch, dsv4moe, args)),
    ]
    only = set(filter(None, args.only.split(",")))
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
            torch.cuda.synchronize()
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
