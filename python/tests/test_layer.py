"""dsv4moe.Layer on the host backends against ``dsv4moe ref`` on NumPy inputs: ref bit for bit in
every output, cpu bit for bit in y and the ids (its router weights within 1e-6, SPEC.md 7).

Needs the CLI and the shared library of a build: ``DSV4MOE_CLI`` (the CLI) and the library found as
dsv4moe._lib says (``DSV4MOE_LIB``, ``DSV4MOE_BUILD``, or the checkout's build/). Skipped without
them (the C test that runs these, tests/test_engines.c, sets both).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import dsv4moe
from dsv4moe import testing as t


def _cli():
    p = os.environ.get("DSV4MOE_CLI")
    return p if p and os.path.exists(p) else None


@unittest.skipUnless(_cli(), "DSV4MOE_CLI is not set to the dsv4moe CLI")
class LayerOnHostBackends(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dsv4moe-pytest-")
        cls.cases = {}
        for layer in (0, 1):  # layer 0 of mini is a hash layer, layer 1 a routed one
            d = os.path.join(cls.dir, "l%d" % layer)
            subprocess.run([_cli(), "gen", "--preset", "mini", "--layer", str(layer), "--tokens", "29", "--seed", "5",
                            "--threads", "2", "--out", d], check=True, capture_output=True)
            out = os.path.join(d, "ref.safetensors")
            subprocess.run([_cli(), "ref", "--preset", "mini", "--layer", str(layer), "--weights",
                            os.path.join(d, "model.safetensors"), "--input", os.path.join(d, "input.safetensors"),
                            "--out", out, "--threads", "2"], check=True, capture_output=True)
            cls.cases[layer] = (d, t.read_safetensors(os.path.join(d, "input.safetensors")),
                                t.read_safetensors(out))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def _tensors(self, st, name):
        return st[name][1]

    def check_layer(self, backend, layer, config=None):
        d, inp, ref = self.cases[layer]
        x = self._tensors(inp, "x")
        ids = self._tensors(inp, "input_ids")
        cfg = config or {"preset": "mini", "layer": layer}
        with dsv4moe.Layer(cfg, os.path.join(d, "model.safetensors"), backend=backend, threads=2) as m:
            self.assertEqual(m.backend_name, backend)
            self.assertEqual(m.hash_layer, layer == 0)
            y, tk, tw = m(x, ids)
            self.assertEqual(y.dtype, np.uint16)
            self.assertEqual(y.shape, x.shape)
            np.testing.assert_array_equal(y, self._tensors(ref, "y"))
            np.testing.assert_array_equal(tk, self._tensors(ref, "topk_ids"))
            rw = self._tensors(ref, "topk_weights")
            if backend == "ref":
                np.testing.assert_array_equal(tw.view(np.uint32), rw.view(np.uint32))
            else:  # the cpu backend's router sums in its own order: weights within SPEC.md 7's 1e-6
                self.assertLess(float(np.max(np.abs(tw - rw))), 1e-6)
            # float input: rounded to bf16, y widened exactly
            yf, _, _ = m(t.from_bf16_bits(x), ids)
            self.assertEqual(yf.dtype, np.float32)
            np.testing.assert_array_equal(t.to_bf16_bits(yf), y)
            y0, k0, w0 = m(x[:0], ids[:0])  # no tokens: empty outputs
            self.assertEqual((y0.shape, k0.shape, w0.shape), ((0, x.shape[1]), (0, k0.shape[1]), (0, k0.shape[1])))
            self.assertEqual(m.workspace_size(16), 0)
            self.assertEqual(m.poll_error()["bad_input_ids"], 0)
            return m

    def test_ref_bit_identical(self):
        for layer in (0, 1):
            self.check_layer("ref", layer)

    def test_cpu_bit_identical(self):
        for layer in (0, 1):
            self.check_layer("cpu", layer)

    def test_tensors_dict_and_yaml_free_config(self):
        d, inp, ref = self.cases[1]
        st = t.read_safetensors(os.path.join(d, "model.safetensors"))
        meta = st.pop("__metadata__", (None, None))[1]
        with dsv4moe.Layer({"preset": "mini", "layer": 1}, st, backend="cpu", metadata=meta) as m:
            y, _, _ = m(self._tensors(inp, "x"))
            np.testing.assert_array_equal(y, self._tensors(ref, "y"))

    def test_errors(self):
        d, inp, _ = self.cases[0]
        w = os.path.join(d, "model.safetensors")
        with self.assertRaises(ValueError):
            dsv4moe.Layer("mini", w, backend="tpu")
        with self.assertRaises(dsv4moe.Error) as cm:
            dsv4moe.Layer({"preset": "mini", "layer": 0, "no_such_key": 1}, w)
        self.assertIn("no_such_key", str(cm.exception))
        with self.assertRaises(dsv4moe.Error) as cm:
            dsv4moe.Layer("no-such-preset", w)
        # the backend's own parameters (dsv4_backend_options.params): a key it lacks is refused by name
        with self.assertRaises(dsv4moe.Error) as cm:
            dsv4moe.Layer({"preset": "mini", "layer": 0}, w, backend="cpu", params="tileh=s64")
        self.assertIn("tileh", str(cm.exception))
        with dsv4moe.Layer({"preset": "mini", "layer": 0}, w, backend="cpu", params="kernels=ref") as m:
            x = self._tensors(inp, "x")
            ids = np.array(self._tensors(inp, "input_ids"), dtype=np.int32)
            self.assertEqual(m(x, ids)[0].shape, x.shape)
        with dsv4moe.Layer({"preset": "mini", "layer": 0}, w, backend="cpu") as m:
            x = self._tensors(inp, "x")
            ids = np.array(self._tensors(inp, "input_ids"), dtype=np.int32)
            ids[3] = 1 << 30
            with self.assertRaises(dsv4moe.Error) as cm:
                m(x, ids)
            self.assertEqual(cm.exception.status, 6)
            self.assertIn("input_ids[3]", str(cm.exception))
            with self.assertRaises(dsv4moe.Error):
                m(x)  # a hash layer without ids
            with self.assertRaises(ValueError):
                m(x[:, :8], ids)
            with self.assertRaises(dsv4moe.Error) as cm:  # no stream on a host backend
                m.enqueue(0, 1, 1, None, 1)
            self.assertEqual(cm.exception.status, 9)


class ImportsWithoutLibrary(unittest.TestCase):
    def test_lazy(self):
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dsv4moe.__file__)))
        env = dict(os.environ, DSV4MOE_LIB="/nonexistent/libdsv4moe.so",
                   PYTHONPATH=os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]))
        code = ("import dsv4moe, dsv4moe.testing\n"
                "try:\n    dsv4moe.Layer('mini', 'x')\nexcept dsv4moe.Error as e:\n"
                "    assert 'libdsv4moe.so not found' in str(e), e\n    print('lazy ok')\n")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, cwd=tempfile.gettempdir())
        self.assertIn("lazy ok", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
