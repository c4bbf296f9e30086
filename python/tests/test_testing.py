"""Unit tests of dsv4moe.testing on hand-made case folders (unittest; pytest collects them too)."""
import json
import os
import shutil
import tempfile
import unittest

import numpy as np

from dsv4moe import testing as t

E, K, T, H = 8, 3, 6, 16


def make_case(root, cid="c0", tokens=T):
    rng = np.random.default_rng(3)
    folder = os.path.join(root, cid)
    os.makedirs(folder)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    y = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.array([[(t + j) % E for j in range(K)] for t in range(tokens)], dtype=np.int32).reshape(tokens, K)
    if tokens:
        ids[0, 2] = E  # a pruned slot
    w = np.where(ids == E, 0, rng.uniform(0.1, 1, (tokens, K))).astype(np.float32)
    t.write_safetensors(os.path.join(folder, "input.safetensors"),
                        {"x": ("BF16", t.to_bf16_bits(x)), "input_ids": ("I32", np.arange(tokens, dtype=np.int32))})
    terms = (np.abs(y) + 4.0).astype(np.float32)  # S: the magnitudes summed (here 4 more than |y|)
    for name, yp in (("expected.safetensors", y), ("expected.bf16_ops.safetensors", y + np.float32(0.5))):
        t.write_safetensors(os.path.join(folder, name),
                            {"y": ("BF16", t.to_bf16_bits(yp)), "topk_ids": ("I32", ids), "topk_weights": ("F32", w),
                             "y_terms": ("F32", terms)}, {"n_routed_experts": E})
    t.write_safetensors(os.path.join(folder, "model.safetensors"), {"w": ("F32", np.zeros(2, np.float32))})
    meta = {"format": "dsv4moe-engine-case", "version": 2, "case": cid, "name": "hand/" + cid, "layer": 1,
            "tokens": tokens, "layout": "split",
            "files": {"model": "model.safetensors", "input": "input.safetensors", "expected": "expected.safetensors",
                      "expected_by_rounding": {"spec": "expected.safetensors",
                                               "bf16_ops": "expected.bf16_ops.safetensors"}},
            "config": {"dim": H, "n_routed_experts": E, "n_activated": K, "shared_clamp": True, "top_p": 0.6},
            "checks": ["numerics", "routing"]}
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(meta, f)
    seal(root)
    return folder


def seal(root):
    """The export's manifest of the hand-made case folders (as dsv4moe export writes it last)."""
    import zlib
    cases = {}
    for cid in sorted(os.listdir(root)):
        d = os.path.join(root, cid)
        if not os.path.isfile(os.path.join(d, "case.json")):
            continue
        files = {}
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            files[name] = {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
        cases[cid] = files
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump({"format": "dsv4moe-engine-export", "version": 1, "cases": cases}, f)


class TestingHelper(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="dsv4moe-testing-")
        make_case(self.root)
        make_case(self.root, "c1-empty", tokens=0)
        self.case = t.cases(self.root)[0]

    def tearDown(self):
        shutil.rmtree(self.root)

    def test_cases_and_tensors(self):
        cs = t.cases(self.root)
        self.assertEqual([c.id for c in cs], ["c0", "c1-empty"])
        c = cs[0]
        self.assertEqual(c.x.shape, (T, H))
        self.assertEqual(c.x.dtype, np.float32)
        self.assertEqual(c.config_strings()["shared_clamp"], "true")
        self.assertEqual(c.expected["topk_ids"][0, 2], E)
        self.assertEqual(len(t.cases(self.root, where=lambda c: c.tokens == 0)), 1)
        with self.assertRaises(t.CaseError):
            t.cases(os.path.join(self.root, "c0"))

    def test_exact_passes_in_any_slot_order_and_dtype(self):
        e = self.case.expected
        v = self.case.check(e["y_bits"], e["topk_ids"][:, ::-1], e["topk_weights"][:, ::-1])
        self.assertTrue(v.ok, v.line)
        self.assertIn("pass c0", str(v))
        v = self.case.check(e["y"].astype(np.float64), e["topk_ids"], e["topk_weights"].astype(np.float64))
        self.assertTrue(v.ok)
        ids = np.where(e["topk_ids"] == E, -1, e["topk_ids"])
        self.assertTrue(self.case.check(e["y"], ids, e["topk_weights"], sentinel="-1").ok)
        with self.assertRaises(t.CheckFailed):
            self.case.check(e["y"], ids, e["topk_weights"])  # -1 is malformed under sentinel E
        self.assertTrue(t.cases(self.root)[1].check(np.zeros((0, H), np.float32)).ok)

    def test_small_errors_pass_large_fail(self):
        e = self.case.expected
        y = e["y"] * np.float32(1 + 2 ** -10)  # a few bf16 ulps: within the engine rule
        v = self.case.check(y)
        self.assertTrue(v.ok, v.line)
        y = e["y"].copy()
        y[0, :] += 1.0  # one whole row off: 16 of 96 elements beyond atol/rtol
        with self.assertRaises(t.CheckFailed) as cm:
            self.case.check(y)
        self.assertIn("outside tolerance broken", str(cm.exception))
        self.assertIn("rounding spec", str(cm.exception))
        self.assertFalse(self.case.check(y, fp8=True, raise_on_failure=False).ok)  # 16 > 2 % of 96 too

    def test_terms_and_rounding_profiles(self):
        e = self.case.expected
        # 0.038 off everywhere: beyond atol + rtol |b| where |b| < 0.086, within 2^-8 S (S >= 4 adds 0.0156)
        y = t.from_bf16_bits(e["y_bits"]).astype(np.float64) + 0.038
        v = self.case.check(y, raise_on_failure=False)
        self.assertGreater(v.metrics["tol_violations"], 1)
        self.assertEqual(v.metrics["beyond_terms"], 0)
        self.assertTrue(v.ok, v.line)
        self.assertIn("beyond 0 with S, %d without" % v.metrics["tol_violations"], v.line)
        ok, _, _ = t.compare(t.to_bf16_bits(y), e["y_bits"], "outside")  # S = 0: the plain count judges
        self.assertFalse(ok)
        # the bf16_ops profile's expected output (0.5 above spec's): an engine at that profile
        b = self.case.expected_at("bf16_ops")
        self.assertTrue(self.case.check(b["y"], rounding="bf16_ops").ok)
        self.assertFalse(self.case.check(b["y"], raise_on_failure=False).ok)  # held to spec
        self.assertFalse(self.case.check(e["y"], rounding="bf16_ops", raise_on_failure=False).ok)
        with self.assertRaises(t.CaseError) as cm:
            self.case.check(e["y"], rounding="fp32")  # not exported
        self.assertIn("exported without rounding fp32 (it has: spec bf16_ops)", str(cm.exception))
        with self.assertRaises(t.CaseError):
            self.case.check(e["y"], rounding="bf16")
        # an output that names its profile is held to it by the command line
        out = os.path.join(self.root, "out-r")
        self.case.write_output(out, b["y_bits"], engine="hand", rounding="bf16_ops")
        t.cases(self.root)[1].write_output(out, np.zeros((0, H), np.float32))
        self.assertEqual(t._main([self.root, "--outputs", out]), 0)
        self.case.write_output(out, b["y_bits"], engine="hand")
        self.assertEqual(t._main([self.root, "--outputs", out]), 1)
        self.assertEqual(t._main([self.root, "--outputs", out, "--rounding", "bf16_ops"]), 0)
        with self.assertRaises(ValueError):
            self.case.write_output(out, b["y_bits"], rounding="fp16")

    def test_malformed_profiles(self):
        folder = os.path.join(self.root, "c0")
        # y_terms of the wrong shape, then negative where y is finite
        p = os.path.join(folder, "expected.bf16_ops.safetensors")
        r = t.read_safetensors(p)
        r.pop("__metadata__")
        good = dict(r)
        r["y_terms"] = ("F32", np.zeros((T, H + 1), np.float32))
        t.write_safetensors(p, r)
        seal(self.root)
        with self.assertRaises(t.CaseError) as cm:
            t.cases(self.root)[0].check(np.zeros((T, H), np.float32), rounding="bf16_ops")
        self.assertIn("y_terms must be F32 [%d, %d]" % (T, H), str(cm.exception))
        r["y_terms"] = ("F32", -np.ones((T, H), np.float32))
        t.write_safetensors(p, r)
        seal(self.root)
        with self.assertRaises(t.CaseError) as cm:
            t.cases(self.root)[0].check(np.zeros((T, H), np.float32), rounding="bf16_ops")
        self.assertIn("a term bound is >= 0", str(cm.exception))
        t.write_safetensors(p, good)
        seal(self.root)
        # a version 1 folder, a profile map naming a path outside the folder
        cj = os.path.join(folder, "case.json")
        with open(cj) as f:
            meta = json.load(f)
        for change, needle in ((("version", 1), "export the cases again"),
                               (("files", dict(meta["files"], expected_by_rounding={"spec": "../x"})),
                                "expected_by_rounding")):
            m2 = dict(meta)
            m2[change[0]] = change[1]
            with open(cj, "w") as f:
                json.dump(m2, f)
            seal(self.root)
            with self.assertRaises(t.CaseError) as cm:
                t.cases(self.root)
            self.assertIn(needle, str(cm.exception))
        with open(cj, "w") as f:
            json.dump(meta, f)
        seal(self.root)

    def test_manifest_holds_the_export(self):
        # a case folder added, a file altered, the manifest missing: CaseError before any verdict
        extra = os.path.join(self.root, "zz")
        make_case(self.root, "zz")
        t.cases(self.root)  # sealed again by make_case
        with open(os.path.join(self.root, "manifest.json")) as f:
            m = json.load(f)
        del m["cases"]["zz"]
        with open(os.path.join(self.root, "manifest.json"), "w") as f:
            json.dump(m, f)
        with self.assertRaises(t.CaseError) as cm:
            t.cases(self.root)
        self.assertIn("'zz' is not in the manifest", str(cm.exception))
        shutil.rmtree(extra)
        seal(self.root)
        with open(os.path.join(self.root, "c0", "expected.safetensors"), "ab") as f:
            f.write(b"x")
        with self.assertRaises(t.CaseError) as cm:
            t.cases(self.root)
        self.assertIn("differs from the export's manifest", str(cm.exception))
        os.unlink(os.path.join(self.root, "manifest.json"))
        with self.assertRaises(t.CaseError) as cm:
            t.cases(self.root)
        self.assertIn("no manifest", str(cm.exception))

    def test_nan_rules(self):
        e = self.case.expected
        y = e["y"].copy()
        y[1, 1] = np.nan
        self.assertFalse(self.case.check(y, raise_on_failure=False).ok)
        ok, why, m = t.compare(t.to_bf16_bits([np.nan, 1.0]), t.to_bf16_bits([np.nan, 1.0]))
        self.assertFalse(ok)  # a NaN pair never agrees
        self.assertEqual(m["ref_nonfinite_bad"], 1)
        ok, _, m = t.compare(t.to_bf16_bits([np.inf, 1.0]), t.to_bf16_bits([np.inf, 1.0]))
        self.assertTrue(ok)
        ok, _, _ = t.compare(t.to_bf16_bits([1.0, 1.0]), t.to_bf16_bits([np.inf, 1.0]))
        self.assertFalse(ok)

    def test_routing_by_expert_id(self):
        e = self.case.expected
        w = e["topk_weights"].astype(np.float64)
        w[2, 1] *= 1 + 2e-6  # within 1e-6 + 1e-5 |b|
        self.assertTrue(self.case.check(e["y"], e["topk_ids"], w).ok)
        w[2, 1] *= 1 + 1e-4
        v = self.case.check(e["y"], e["topk_ids"], w, raise_on_failure=False)
        self.assertFalse(v.ok)
        self.assertIn("topk_weights", v.line)
        ids = e["topk_ids"].copy()
        ids[0, 2] = 0  # the pruned slot computed as expert 0
        v = self.case.check(e["y"], ids, raise_on_failure=False)
        self.assertFalse(v.ok)
        self.assertIn("token 0", v.line)
        # absent: the kept experts only, padding out of range
        ok, why, _ = t.compare_routing(np.where(e["topk_ids"] == E, 99, e["topk_ids"]), None, e["topk_ids"],
                                       e["topk_weights"], E, "absent")
        self.assertTrue(ok, why)
        with self.assertRaises(t.CaseError):
            self.case.check(e["y"], topk_weights=e["topk_weights"])

    def test_shape_and_files(self):
        with self.assertRaises(t.CaseError):
            self.case.check(np.zeros((T, H + 1), np.float32))
        out = os.path.join(self.root, "out")
        e = self.case.expected
        self.case.write_output(out, e["y_bits"], e["topk_ids"], e["topk_weights"], engine="hand")
        r = t.read_safetensors(os.path.join(out, "c0", "output.safetensors"))
        self.assertEqual(r["y"][0], "BF16")
        self.assertEqual(r["__metadata__"][1]["engine"], "hand")
        self.assertEqual(t._main([self.root, "--outputs", out]), 2)  # c1-empty has no output
        t.cases(self.root)[1].write_output(out, np.zeros((0, H), np.float32))
        self.assertEqual(t._main([self.root, "--outputs", out]), 0)
        bad = os.path.join(self.root, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
        with self.assertRaises(t.CaseError):
            t.read_safetensors(bad)

    def test_bf16_rounding(self):
        v = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, np.inf], np.float32)
        b = t.to_bf16_bits(v)
        self.assertEqual(list(b), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])  # ties to even
        np.testing.assert_array_equal(t.from_bf16_bits(b)[[0, 3]], [1.0, -2.5])


if __name__ == "__main__":
    unittest.main()
