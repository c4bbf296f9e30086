"""dsv4moe.hf_layout: HF's held quantized expert tensors as dsv4moe's split checkpoint, layout only.
Synthetic tensors with exact expected values (NumPy, no torch), and, with the CLI, generated fp4/fp8
checkpoints put into HF's held layout and back: the same bytes, and `dsv4moe ref`'s output bit for
bit from the patch's file."""
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

from dsv4moe import hf, hf_layout as L
from dsv4moe import testing as t


def dims(H, I, E, shared=1):
    return {"dim": H, "moe_inter_dim": I, "n_routed_experts": E, "n_shared_experts": shared}


def router(E, H, hash_layer=False, V=8, K=2):
    out = {"gate.weight": ("BF16", np.arange(E * H, dtype=np.uint16).reshape(E, H) + 0x3F00)}
    if hash_layer:
        out["gate.tid2eid"] = ("I64", (np.arange(V * K, dtype=np.int64) % E).reshape(V, K))
    else:
        out["gate.e_score_correction_bias"] = ("F32", np.linspace(-1, 1, E).astype(np.float32))
    return out


def fp4_experts(E, H, I):
    """Held mxfp4 experts whose byte (and scale) of held row r, expert e is e * 100 + r (mod 256)."""
    rows = np.arange(2 * I)[None, :, None] + 100 * np.arange(E)[:, None, None]
    gu = np.broadcast_to(rows % 256, (E, 2 * I, H // 2)).astype(np.uint8).view(np.int8)
    gus = np.broadcast_to((rows % 200) + 1, (E, 2 * I, H // 32)).astype(np.uint8)
    dn = np.full((E, H, I // 2), 0x21, np.uint8).view(np.int8)
    dns = np.full((E, H, I // 32), 120, np.uint8)
    return {"experts.gate_up_proj": ("I8", gu), "experts.gate_up_proj_scale_inv": ("F8_E8M0", gus),
            "experts.down_proj": ("I8", dn), "experts.down_proj_scale_inv": ("F8_E8M0", dns)}


def fp8_shared(H, I, scale_dtype="F8_E8M0", block=128):
    out = {}
    for p, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
        out["shared_experts.%s.weight" % p] = ("F8_E4M3", np.full((n, k), 0x38, np.uint8))
        grid = (-(-n // block), -(-k // block))
        s = np.arange(np.prod(grid)).reshape(grid) + 120
        out["shared_experts.%s.weight_scale_inv" % p] = (
            (scale_dtype, s.astype(np.uint8)) if scale_dtype == "F8_E8M0" else (scale_dtype, s.astype(np.float32)))
    return out


class Layout(unittest.TestCase):
    def test_deinterleave_and_destack(self):
        a = np.array([[10, 20, 11, 21, 12, 22]])
        g, u = L.deinterleave(a, 1)
        self.assertEqual(g.tolist(), [[10, 11, 12]])
        self.assertEqual(u.tolist(), [[20, 21, 22]])
        g, u = L.destack(a, 1, 3)
        self.assertEqual((g.tolist(), u.tolist()), ([[10, 20, 11]], [[21, 12, 22]]))

    def test_e8m0_values_exact(self):
        f = L.e8m0_to_f32(np.array([127, 128, 126, 0, 254], np.uint8), "s")
        self.assertEqual(f.tolist(), [1.0, 2.0, 0.5, 2.0 ** -127, 2.0 ** 127])
        with self.assertRaisesRegex(L.LayoutError, r"s: scale \[1\] is the e8m0 NaN byte 255"):
            L.e8m0_to_f32(np.array([3, 255], np.uint8), "s")

    def test_fp4_interleaved_rows_split_exactly(self):
        E, H, I = 2, 64, 32
        arrays = dict(router(E, H), **fp4_experts(E, H, I), **fp8_shared(H, I))
        fmt, out = L.split_checkpoint(arrays, 3, dims(H, I, E), interleaved=True)
        self.assertEqual(fmt, {"routed_format": "fp4", "shared_format": "fp8", "weight_scale": "ue8m0",
                               "act_quant": "ue8m0"})
        for e in range(E):
            w1 = out["layers.3.ffn.experts.%d.w1.weight" % e]
            w3 = out["layers.3.ffn.experts.%d.w3.weight" % e]
            self.assertEqual((w1[0], w1[1].shape, w1[1].dtype), ("I8", (I, H // 2), np.int8))
            # held row 2j is gate row j, 2j + 1 up row j: byte e * 100 + r
            self.assertEqual(w1[1].view(np.uint8)[:, 0].tolist(), [(e * 100 + 2 * j) % 256 for j in range(I)])
            self.assertEqual(w3[1].view(np.uint8)[:, 5].tolist(), [(e * 100 + 2 * j + 1) % 256 for j in range(I)])
            s1 = out["layers.3.ffn.experts.%d.w1.scale" % e]
            s3 = out["layers.3.ffn.experts.%d.w3.scale" % e]
            self.assertEqual((s1[0], s1[1].shape), ("F8_E8M0", (I, H // 32)))
            self.assertEqual(s1[1][:, 1].tolist(), [(e * 100 + 2 * j) % 200 + 1 for j in range(I)])
            self.assertEqual(s3[1][:, 0].tolist(), [(e * 100 + 2 * j + 1) % 200 + 1 for j in range(I)])
            self.assertEqual(out["layers.3.ffn.experts.%d.w2.scale" % e][1].tolist(), [[120]] * H)
        self.assertEqual(out["layers.3.ffn.shared_experts.w2.scale"][1].tolist(), [[120]])
        self.assertEqual(out["layers.3.ffn.shared_experts.w1.weight"][0], "F8_E4M3")
        self.assertEqual(out["layers.3.ffn.gate.bias"][1].tolist(), np.linspace(-1, 1, E).astype(np.float32).tolist())
        # stacked rows: the first I rows are the gate
        arrays["experts.gate_up_proj"] = ("I8", arrays["experts.gate_up_proj"][1])
        _, st = L.split_checkpoint(arrays, 3, dims(H, I, E), interleaved=False)
        self.assertEqual(st["layers.3.ffn.experts.1.w3.weight"][1].view(np.uint8)[:, 0].tolist(),
                         [(100 + I + j) % 256 for j in range(I)])

    def test_fp4_float32_scales_back_to_their_ue8m0_bytes(self):
        """FP8Experts under scale_fmt "float" holds fp4 scales as float32 powers of two: the same bytes."""
        E, H, I = 2, 64, 32
        arrays = dict(router(E, H), **fp4_experts(E, H, I), **fp8_shared(H, I))
        want = arrays["experts.gate_up_proj_scale_inv"][1]
        arrays["experts.gate_up_proj_scale_inv"] = ("F32", L.e8m0_to_f32(want, "s"))
        _, a = L.split_checkpoint(arrays, 3, dims(H, I, E), interleaved=False)
        self.assertEqual(a["layers.3.ffn.experts.1.w1.scale"], ("F8_E8M0", a["layers.3.ffn.experts.1.w1.scale"][1]))
        np.testing.assert_array_equal(a["layers.3.ffn.experts.1.w1.scale"][1], want[1, :I])
        np.testing.assert_array_equal(a["layers.3.ffn.experts.0.w3.scale"][1], want[0, I:])
        self.assertEqual(L.f32_to_e8m0(np.array([1.0, 0.25, 2.0 ** -127, 2.0 ** 127], np.float32), "s").tolist(),
                         [127, 125, 0, 254])
        bad = L.e8m0_to_f32(want, "s")
        bad[0, 3, 1] = 0.75
        arrays["experts.gate_up_proj_scale_inv"] = ("F32", bad)
        with self.assertRaisesRegex(L.LayoutError, r"experts.gate_up_proj_scale_inv: scale \[0, 3, 1\] is 0.75, not a "
                                                   r"power of two"):
            L.split_checkpoint(arrays, 3, dims(H, I, E))

    def test_fp8_block_scales_deinterleave_and_mixed_scale_formats(self):
        E, H, I = 1, 128, 256
        gu = np.arange(2 * I, dtype=np.uint8)[None, :, None].repeat(H, axis=2)
        held = np.array([[[1.0], [2.0], [3.0], [4.0]]], np.float32)  # interleaved: g0 u0 g1 u1
        arrays = dict(router(E, H, hash_layer=True), **fp8_shared(H, I, "F8_E8M0"))
        arrays.update({"experts.gate_up_proj": ("F8_E4M3", gu), "experts.gate_up_proj_scale_inv": ("F32", held),
                       "experts.down_proj": ("F8_E4M3", np.zeros((E, H, I), np.uint8)),
                       "experts.down_proj_scale_inv": ("F32", np.array([[[0.25, 0.5]]], np.float32))})
        fmt, out = L.split_checkpoint(arrays, 0, dims(H, I, E), interleaved=True)
        self.assertEqual(fmt, {"routed_format": "fp8", "shared_format": "fp8", "weight_scale": "fp32",
                               "act_quant": "fp32"})
        self.assertEqual(out["layers.0.ffn.experts.0.w1.scale"], ("F32", out["layers.0.ffn.experts.0.w1.scale"][1]))
        self.assertEqual(out["layers.0.ffn.experts.0.w1.scale"][1].tolist(), [[1.0], [3.0]])
        self.assertEqual(out["layers.0.ffn.experts.0.w3.scale"][1].tolist(), [[2.0], [4.0]])
        self.assertEqual(out["layers.0.ffn.experts.0.w1.weight"][1][:4, 0].tolist(), [0, 2, 4, 6])
        self.assertEqual(out["layers.0.ffn.experts.0.w2.scale"][1].tolist(), [[0.25, 0.5]])
        # the shared expert's e8m0 scales next to fp32 ones: the same powers of two in fp32
        self.assertEqual(out["layers.0.ffn.shared_experts.w1.scale"][1].tolist(), [[2.0 ** -7], [2.0 ** -6]])
        self.assertEqual(out["layers.0.ffn.gate.tid2eid"][0], "I32")
        self.assertNotIn("layers.0.ffn.gate.bias", out)
        # stacked rows [g0 g1 u0 u1] give the same halves
        arrays["experts.gate_up_proj_scale_inv"] = ("F32", np.array([[[1.0], [3.0], [2.0], [4.0]]], np.float32))
        gst = np.concatenate([gu[:, 0::2], gu[:, 1::2]], axis=1)
        arrays["experts.gate_up_proj"] = ("F8_E4M3", gst)
        _, o2 = L.split_checkpoint(arrays, 0, dims(H, I, E), interleaved=False)
        for k in ("w1.scale", "w3.scale", "w1.weight", "w3.weight"):
            np.testing.assert_array_equal(o2["layers.0.ffn.experts.0." + k][1], out["layers.0.ffn.experts.0." + k][1])

    def test_per_tensor_scales_repeat_over_blocks(self):
        E, H, I = 2, 256, 128
        arrays = dict(router(E, H), **fp8_shared(H, I, "F32"))
        arrays["shared_experts.up_proj.weight_scale_inv"] = ("F32", np.array(0.75, np.float32))
        arrays.update({"experts.gate_up_proj": ("F8_E4M3", np.zeros((E, 2 * I, H), np.uint8)),
                       "experts.gate_up_proj_scale_inv": ("F32", np.array([[[1.0], [2.0]], [[3.0], [4.0]]], np.float32)),
                       "experts.down_proj": ("F8_E4M3", np.zeros((E, H, I), np.uint8)),
                       "experts.down_proj_scale_inv": ("F32", np.array([[[5.0]], [[6.0]]], np.float32))})
        _, out = L.split_checkpoint(arrays, 1, dims(H, I, E), interleaved=True)
        self.assertEqual(out["layers.1.ffn.experts.1.w1.scale"][1].tolist(), [[3.0, 3.0]])
        self.assertEqual(out["layers.1.ffn.experts.1.w3.scale"][1].tolist(), [[4.0, 4.0]])
        self.assertEqual(out["layers.1.ffn.experts.0.w2.scale"][1].tolist(), [[5.0], [5.0]])
        self.assertEqual(out["layers.1.ffn.shared_experts.w3.scale"][1].tolist(), [[0.75, 0.75]])

    def test_float_blocks_take_the_bf16_path(self):
        E, H, I = 2, 64, 32
        arrays = dict(router(E, H), **{"experts.gate_up_proj": ("BF16", np.zeros((E, 2 * I, H), np.uint16)),
                                       "experts.down_proj": ("F32", np.zeros((E, H, I), np.float32))})
        for p in ("gate_proj", "up_proj", "down_proj"):
            arrays["shared_experts.%s.weight" % p] = ("BF16", np.zeros((5, 5), np.uint16))
        self.assertEqual(L.split_checkpoint(arrays, 1, dims(H, I, E)), (None, None))

    def test_refusals_name_the_tensor_and_the_rule(self):
        E, H, I = 2, 256, 128
        base = dict(router(E, H), **fp4_experts(E, H, I), **fp8_shared(H, I))
        cases = [
            ({"shared_experts.gate_proj.weight_scale_inv": ("F32", np.ones((4, 8), np.float32))},
             r"shared_experts.gate_proj.weight_scale_inv has shape \[4, 8\].*128x128 block"),
            ({"experts.gate_up_proj_scale_inv": ("F8_E8M0", np.ones((E, 2, 2, 2, 256), np.uint8))},
             r"experts.gate_up_proj_scale_inv is held swizzled"),
            ({"experts.down_proj_scale_inv": ("F8_E4M3", np.ones((E, H, I // 16), np.uint8))},
             r"experts.down_proj_scale_inv is F8_E4M3: fp4 weights take ue8m0 scales \(MXFP4\).*NVFP4"),
            ({"experts.down_proj_scale_inv": ("F8_E8M0", np.ones((E, H, I // 16), np.uint8))},
             r"experts.down_proj_scale_inv has shape .*one ue8m0 scale per 32 of K"),
            ({"experts.down_proj_weight_global_scale": ("F32", np.ones(E, np.float32))},
             r"experts.down_proj_weight_global_scale is held"),
            ({"shared_experts.up_proj.activation_scale": ("F32", np.ones((), np.float32))},
             r"shared_experts.up_proj.activation_scale is held"),
            ({"shared_experts.down_proj.weight_scale_inv": ("F8_E8M0", np.full((2, 1), 255, np.uint8))},
             r"shared_experts.down_proj.weight_scale_inv: scale \[0, 0\] is the e8m0 NaN byte"),
            ({"experts.gate_up_proj_scale_inv": ("F8_E8M0", np.full((E, 2 * I, H // 32), 255, np.uint8))},
             r"experts.gate_up_proj_scale_inv\[0\]: scale \[0, 0\] is the e8m0 NaN byte 255"),
            ({"gate.e_score_correction_bias": None, "gate.tid2eid": ("I64", np.array([[0, 2]], np.int64))},
             r"gate.tid2eid\[0, 1\] is 2: outside \[0, 2\)"),
            ({"gate.weight": ("F32", np.full((E, H), 1.0 + 2.0 ** -12, np.float32))},
             r"gate.weight: element \[0, 0\] is 1.00024414, not a bf16 value"),
            ({"experts.down_proj": ("F8_E4M3", np.zeros((E, H, I), np.uint8)),
              "experts.down_proj_scale_inv": ("F32", np.ones((E, 2, 1), np.float32))},
             r"experts.gate_up_proj is fp4 and experts.down_proj fp8: one routed format per layer"),
            ({"shared_experts.up_proj.weight": ("BF16", np.zeros((I, H), np.uint16))},
             r"shared expert's projections are held in \['bf16', 'fp8'\]"),
            ({"experts.gate_up_proj": ("F8_E4M3", np.zeros((E, 2 * I, H), np.uint8)),
              "experts.gate_up_proj_scale_inv": ("F8_E8M0", np.ones((E, 2 * I, H // 32), np.uint8))},
             r"experts.gate_up_proj_scale_inv holds 1x32 scales of e4m3 weights \(MXFP8\)"),
        ]
        for change, msg in cases:
            arrays = dict(base)
            for k, v in change.items():
                if v is None:
                    arrays.pop(k)
                else:
                    arrays[k] = v
            with self.assertRaisesRegex(L.LayoutError, msg):
                L.split_checkpoint(arrays, 1, dims(H, I, E), interleaved=True)

    def test_checkpoint_formats_from_the_headers(self):
        d = tempfile.mkdtemp(prefix="dsv4moe-ckfmt-")
        try:
            E, H, I = 2, 256, 128
            arrays = dict(router(E, H), **fp4_experts(E, H, I), **fp8_shared(H, I, "F32"))
            _, tens = L.split_checkpoint(arrays, 4, dims(H, I, E), interleaved=True)
            os.makedirs(os.path.join(d, "ck"))
            a = {k: v for k, v in tens.items() if "shared" in k}
            t.write_safetensors(os.path.join(d, "ck", "a.safetensors"), a)
            t.write_safetensors(os.path.join(d, "ck", "b.safetensors"), {k: v for k, v in tens.items() if k not in a})
            self.assertEqual(hf.checkpoint_formats(os.path.join(d, "ck"), 4),
                             {"routed_format": "fp4", "shared_format": "fp8", "weight_scale": "fp32", "act_quant": "fp32"})
            with self.assertRaisesRegex(ValueError, r"no layers.3.ffn.experts.0.w1.weight in the split layout"):
                hf.checkpoint_formats(os.path.join(d, "ck"), 3)
            mixed = dict(tens)
            mixed["layers.4.ffn.shared_experts.w2.scale"] = ("F8_E8M0", np.ones((2, 1), np.uint8))
            t.write_safetensors(os.path.join(d, "m.safetensors"), mixed)
            with self.assertRaisesRegex(ValueError, r"layer 4's fp8 scales are held as \['F32', 'F8_E8M0'\]"):
                hf.checkpoint_formats(os.path.join(d, "m.safetensors"), 4)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_formats_name_that_would_requantize_is_refused(self):
        held = {"routed_format": "fp8", "shared_format": "fp8", "weight_scale": "fp32", "act_quant": "fp32"}
        hf._same_formats(held, None, 2, "the block holds")
        hf._same_formats(held, "fp8", 2, "the block holds")
        with self.assertRaisesRegex(ValueError, r"block 2: the block holds routed fp8 / shared fp8 weights; "
                                                r"formats='fp4' would convert them"):
            hf._same_formats(held, "fp4", 2, "the block holds")


@unittest.skipUnless(os.environ.get("DSV4MOE_CLI"), "DSV4MOE_CLI is not set")
class HeldCheckpointRunsOnTheLibrary(unittest.TestCase):
    """Generated fp4/fp8 checkpoints (mini: routed fp4, shared fp8, ue8m0; mini-fp8: routed and shared
    fp8, fp32 scales) put into HF's held layout (experts stacked, gate|up rows interleaved or not) and
    back through split_checkpoint: every tensor byte-identical to the generated one, the formats the
    presets', and a Layer on the written file gives `dsv4moe ref`'s y on the generated one bit for bit."""

    def test_held_checkpoint_matches_ref(self):
        import dsv4moe
        cli = os.environ["DSV4MOE_CLI"]
        d = tempfile.mkdtemp(prefix="dsv4moe-held-")
        try:
            for preset, layer, interleaved in (("mini", 1, True), ("mini", 0, False), ("mini-fp8", 1, True)):
                out = os.path.join(d, "%s-l%d" % (preset, layer))
                subprocess.run([cli, "gen", "--preset", preset, "--layer", str(layer), "--tokens", "21", "--seed", "4",
                                "--threads", "2", "--out", out], check=True, capture_output=True)
                src = t.read_safetensors(os.path.join(out, "model.safetensors"))
                src.pop("__metadata__", None)
                with dsv4moe.Layer({"preset": preset, "layer": layer}, os.path.join(out, "model.safetensors"),
                                   backend="ref") as m:
                    dm = {k: int(m.config_value(k)) for k in ("dim", "moe_inter_dim", "n_routed_experts",
                                                              "n_shared_experts")}
                    want_fmt = {k: m.config_value(k) for k in ("routed_format", "shared_format", "weight_scale")}
                held = L.held_from_split(src, layer, dm["n_routed_experts"], interleaved=interleaved)
                self.assertEqual(held["experts.gate_up_proj"][1].shape[0], dm["n_routed_experts"])
                fmt, tens = L.split_checkpoint(held, layer, dm, interleaved=interleaved)
                self.assertEqual({k: fmt[k] for k in want_fmt}, want_fmt)
                self.assertEqual(sorted(tens), sorted(k for k in src if not k.endswith("norm_predictor.norm")))
                for k, (dt, a) in tens.items():
                    sdt, sa = src[k]
                    self.assertEqual((k, dt if dt != "I8" else sdt), (k, sdt))
                    self.assertEqual(np.ascontiguousarray(a).tobytes(), np.ascontiguousarray(sa).tobytes(), k)
                path = os.path.join(out, "held.safetensors")
                t.write_safetensors(path, tens)
                ref = os.path.join(out, "ref.safetensors")
                subprocess.run([cli, "ref", "--preset", preset, "--layer", str(layer), "--weights",
                                os.path.join(out, "model.safetensors"), "--input", os.path.join(out, "input.safetensors"),
                                "--out", ref, "--threads", "2"], check=True, capture_output=True)
                inp = t.read_safetensors(os.path.join(out, "input.safetensors"))
                with dsv4moe.Layer(dict(fmt, preset=preset, layer=layer), path, backend="ref", threads=2) as m:
                    y, ids, _ = m(inp["x"][1], inp["input_ids"][1])
                want = t.read_safetensors(ref)
                np.testing.assert_array_equal(y, want["y"][1])
                np.testing.assert_array_equal(ids, want["topk_ids"][1])
                self.assertEqual(hf.checkpoint_formats(path, layer), fmt)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
