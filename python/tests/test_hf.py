"""dsv4moe.hf's mapping of an HF DeepseekV4SparseMoeBlock and its config, on stand-ins (torch and
transformers are not needed: the mapping reads attributes and the shared expert's source)."""
import types
import unittest

from dsv4moe import hf


class DeepseekV4MLP:
    def forward(self, x):
        gate = self.gate_proj(x).clamp(max=self.limit)  # the clamp this version applies
        return gate


class NoClampMLP:
    def forward(self, x):
        return self.down_proj(x)


class DeepseekV4SparseMoeBlock:
    def __init__(self, is_hash, mlp=DeepseekV4MLP):
        self.is_hash = is_hash
        self.shared_experts = mlp()


class Model:
    def __init__(self, blocks):
        self.blocks = blocks

    def named_modules(self):
        yield "", self
        for i, b in enumerate(self.blocks):
            yield "model.layers.%d.mlp" % i, b


def hf_config(**kw):
    c = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4,
             n_shared_experts=1, vocab_size=512, num_hidden_layers=4, routed_scaling_factor=1.5,
             scoring_func="sqrtsoftplus", swiglu_limit=10.0, mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
    c.update(kw)
    return types.SimpleNamespace(**c)


class HfMapping(unittest.TestCase):
    def test_config_of_a_routed_and_a_hash_block(self):
        c = hf.block_config(DeepseekV4SparseMoeBlock(False), hf_config(), 2)
        self.assertEqual((c["dim"], c["moe_inter_dim"], c["n_routed_experts"], c["n_activated"]), (256, 128, 16, 4))
        self.assertEqual((c["n_layers"], c["n_hash_layers"], c["layer"]), (4, 1, 2))
        self.assertEqual(c["route_scale"], 1.5)
        self.assertEqual(c["score_func"], "sqrtsoftplus")
        self.assertEqual(c["swiglu_limit"], 10.0)
        self.assertTrue(c["shared_clamp"])
        self.assertEqual(c["weight_point"], "after_w2")
        self.assertEqual(c["top_p"], 1.0)
        self.assertEqual((c["routed_format"], c["shared_format"], c["act_quant"], c["gemm"]),
                         ("fp4", "fp8", "ue8m0", "fp8"))
        h = hf.block_config(DeepseekV4SparseMoeBlock(True), hf_config(), 0, formats="bf16")
        self.assertEqual(h["n_hash_layers"], 1)
        self.assertEqual((h["routed_format"], h["act_quant"], h["gemm"]), ("bf16", "none", "exact"))

    def test_num_hash_layers_and_shared_clamp_from_source(self):
        cfg = hf_config(mlp_layer_types=None, num_hash_layers=2)
        c = hf.block_config(DeepseekV4SparseMoeBlock(True, NoClampMLP), cfg, 1)
        self.assertEqual(c["n_hash_layers"], 2)
        self.assertFalse(c["shared_clamp"])

    def test_refusals(self):
        with self.assertRaises(ValueError):  # is_hash disagrees with the config
            hf.block_config(DeepseekV4SparseMoeBlock(False), hf_config(), 0)
        with self.assertRaises(ValueError):
            hf.block_config(DeepseekV4SparseMoeBlock(False), hf_config(), 1, formats="int4")
        with self.assertRaises(ValueError):
            hf.block_config(DeepseekV4SparseMoeBlock(False),
                            hf_config(mlp_layer_types=["moe", "hash_moe", "moe", "moe"]), 2)

    def test_blocks_found_with_their_layer(self):
        blocks = [DeepseekV4SparseMoeBlock(i == 0) for i in range(3)]
        found = hf._blocks(Model(blocks))
        self.assertEqual([i for i, _ in found], [0, 1, 2])
        self.assertIs(found[1][1], blocks[1])
        with self.assertRaises(ValueError):
            hf._blocks(blocks[0])  # a bare block without a layer id
        blocks[0].dsv4moe_layer = 0
        self.assertEqual(hf._blocks(blocks[0])[0][0], 0)
        with self.assertRaises(ValueError):
            hf._blocks(Model([]))


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(__import__("os").environ.get("DSV4MOE_CLI"), "DSV4MOE_CLI is not set")
class HfConfigRunsOnTheLibrary(unittest.TestCase):
    """The mapped config of HF's block on a stacked bf16 checkpoint (HF's key names): the layer
    gives `dsv4moe ref`'s y bit for bit with the same keys (backend ref; bf16, and fp4/fp8 quantized
    from the bf16 file at load)."""

    def test_mapped_config_matches_ref(self):
        import os
        import shutil
        import subprocess
        import tempfile

        import numpy as np

        import dsv4moe
        from dsv4moe import testing as t
        cli = os.environ["DSV4MOE_CLI"]
        d = tempfile.mkdtemp(prefix="dsv4moe-hf-")
        try:
            for layer in (0, 1):
                out = os.path.join(d, "l%d" % layer)
                subprocess.run([cli, "gen", "--preset", "mini-bf16", "--layer", str(layer), "--layout", "stacked",
                                "--model-prefix", "--tokens", "19", "--seed", "3", "--threads", "2", "--out", out],
                               check=True, capture_output=True)
                blk = DeepseekV4SparseMoeBlock(layer == 0)
                cfgh = hf_config(scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=7.0)
                for formats in ("bf16", "fp4"):
                    conf = hf.block_config(blk, cfgh, layer, formats=formats, gemm="exact")
                    sets = []
                    for k, v in conf.items():
                        sets += ["--set", "%s=%s" % (k, str(v).lower() if isinstance(v, bool) else v)]
                    ref = os.path.join(out, "ref-%s.safetensors" % formats)
                    subprocess.run([cli, "ref", "--preset", "mini-bf16", "--layer", str(layer), "--weights",
                                    os.path.join(out, "model.safetensors"), "--input",
                                    os.path.join(out, "input.safetensors"), "--out", ref, "--threads", "2"] + sets,
                                   check=True, capture_output=True)
                    inp = t.read_safetensors(os.path.join(out, "input.safetensors"))
                    want = t.read_safetensors(ref)
                    with dsv4moe.Layer(dict(conf, preset="mini-bf16"), os.path.join(out, "model.safetensors"),
                                       backend="ref", threads=2) as m:
                        y, ids, _ = m(inp["x"][1], inp["input_ids"][1])
                    np.testing.assert_array_equal(y, want["y"][1])
                    np.testing.assert_array_equal(ids, want["topk_ids"][1])
        finally:
            shutil.rmtree(d, ignore_errors=True)
