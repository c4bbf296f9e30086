"""dsv4moe.Layer: one DeepSeek-V4 MoE layer on a dsv4moe backend (docs/embedding.md).

    layer = dsv4moe.Layer("mini", "w.safetensors", backend="cpu")       # a preset, a checkpoint
    y, topk_ids, topk_weights = layer(x, input_ids)                      # NumPy in, NumPy out

``config``: a preset name, a YAML file, or a dict of config keys (``{"preset": "mini", "layer": 1,
"gemm": "fp8"}``: the preset, then each key set as ``dsv4moe --set key=value`` would).
``checkpoint``: a safetensors file or folder (the layouts of docs/checkpoints.md), or a dict of
tensors ``{name: array}`` (written once to a private file for the layer's life; bf16 as uint16
bits, ``(dtype, array)`` pairs name other safetensors dtypes, torch tensors are accepted).

NumPy: x ``[T, H]`` bf16 bits (uint16; y comes back as uint16 bits) or float (rounded to bf16 to
nearest even; y comes back as float32, exactly the bf16 values); input_ids int32 ``[T]`` on hash
layers. Any backend (cuda through its host-staged forward).

torch (when installed): x a bf16 tensor on the layer's GPU (backend "cuda"): the forward is enqueued
on the current torch stream with the tensors' device pointers, no copy and no host synchronisation,
through the custom op ``torch.ops.dsv4moe.moe`` (a fake implementation gives shapes to
torch.compile), so torch.cuda.graph captures it. Input checks are latched on the device: call
``layer.poll_error()`` (after the stream's work) to raise them. CPU tensors go through NumPy views.
"""

import ctypes
import os
import shutil
import tempfile
import threading

import numpy as np

from . import _lib
from ._lib import check

_LAYERS = {}
_LAYERS_LOCK = threading.Lock()
_NEXT = [1]
_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int32): "I32",
           np.dtype(np.int64): "I64", np.dtype(np.uint16): "BF16", np.dtype(np.uint8): "U8",
           np.dtype(np.int8): "I8", np.dtype(np.float16): "F16"}
_TORCH_DTYPES = {"torch.bfloat16": ("BF16", "int16", np.uint16), "torch.float8_e4m3fn": ("F8_E4M3", "uint8", np.uint8),
                 "torch.float8_e8m0fnu": ("F8_E8M0", "uint8", np.uint8), "torch.float32": ("F32", None, None),
                 "torch.int32": ("I32", None, None), "torch.int64": ("I64", None, None),
                 "torch.uint8": ("U8", None, None), "torch.int8": ("I8", None, None),
                 "torch.float16": ("F16", None, None)}


def _is_torch(a):
    return type(a).__module__.startswith("torch") and hasattr(a, "data_ptr")


def tensor_to_numpy(t):
    """(safetensors dtype, numpy array) of a torch tensor on the host, without a copy where it can."""
    name, view, np_dt = _TORCH_DTYPES.get(str(t.dtype), (None, None, None))
    if name is None:
        raise TypeError("tensor dtype %s has no safetensors mapping here" % t.dtype)
    import torch  # noqa: F401  (present: t is a torch tensor)
    t = t.detach().contiguous().cpu()
    if view:
        return name, t.view(getattr(torch, view)).numpy().view(np_dt)
    return name, t.numpy()


def _tensor_entry(name, v):
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        return v
    if _is_torch(v):
        return tensor_to_numpy(v)
    a = np.asarray(v)
    if a.dtype not in _DTYPES:
        raise TypeError("tensor %r: dtype %s; pass (safetensors dtype, array)" % (name, a.dtype))
    return _DTYPES[a.dtype], a


class Layer:
    """One MoE layer on a backend; see the module's documentation. Not thread-safe: one caller at a
    time per Layer (the C backend's rule, include/dsv4moe/backend.h). params: the backend's own
    parameters, e.g. "kernels=avx2" (cpu) or "path=exact" (cuda), as dsv4_backend_options.params."""

    def __init__(self, config, checkpoint, backend="cpu", *, threads=1, max_tokens=4096, chunk_tokens=0,
                 cuda_graph=False, device_bytes=None, workspace=None, metadata=None, params=None):
        L = _lib.lib()
        self._lib = L
        self._b = self._plan = self._ck = None
        self._tmp = None
        if backend not in _lib.BACKENDS:
            raise ValueError("backend %r: one of %s" % (backend, ", ".join(_lib.BACKENDS)))
        self.backend = backend
        err = _lib.DsvError()
        self._cfg = ctypes.create_string_buffer(_lib.CONFIG_BYTES)
        self._make_config(config, err)
        check(L.dsv4_config_validate(self._cfg, ctypes.byref(err)), err)
        self.dim = int(self.config_value("dim"))
        self.n_activated = int(self.config_value("n_activated"))
        self.n_routed_experts = int(self.config_value("n_routed_experts"))
        self.hash_layer = bool(L.dsv4_config_is_hash_layer(self._cfg))
        self.max_tokens = int(max_tokens)
        path = checkpoint
        if isinstance(checkpoint, dict):
            from .testing import write_safetensors
            self._tmp = tempfile.mkdtemp(prefix="dsv4moe-layer-")
            path = os.path.join(self._tmp, "model.safetensors")
            write_safetensors(path, {k: _tensor_entry(k, v) for k, v in checkpoint.items()}, metadata)
        topo = _lib.Topology()
        L.dsv4_topology_init(ctypes.byref(topo))
        topo.backend = _lib.BACKENDS[backend]
        topo.max_tokens_per_rank = self.max_tokens
        topo.chunk_tokens = int(chunk_tokens)
        topo.host_threads = int(threads)
        if cuda_graph:
            buckets = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= self.max_tokens]
            topo.cuda_graph = True
            topo.n_buckets = len(buckets)
            for i, b in enumerate(buckets):
                topo.buckets[i] = b
        bud = _lib.Budget()
        L.dsv4_budget_init(ctypes.byref(bud))
        if device_bytes:
            bud.device_bytes = int(device_bytes)
        plan = ctypes.c_void_p()
        check(L.dsv4_plan_create(self._cfg, ctypes.byref(topo), ctypes.byref(bud), ctypes.byref(plan),
                                 ctypes.byref(err)), err)
        self._plan = plan
        ck = ctypes.c_void_p()
        check(L.dsv4_checkpoint_open(os.fsencode(os.fspath(path)), ctypes.byref(ck), ctypes.byref(err)), err)
        self._ck = ck
        opt = _lib.Options()
        L.dsv4_backend_options_init(ctypes.byref(opt))
        opt.threads = int(threads)
        # the backend's own parameters (docs/cpu.md, docs/cuda.md "Parameters"), read at creation
        params_b = params.encode() if params else None
        opt.params = params_b
        self._workspace = workspace  # kept alive as long as the layer
        if workspace is not None:
            ptr, nbytes = workspace
            opt.workspace = int(ptr)
            opt.workspace_bytes = int(nbytes)
        b = ctypes.c_void_p()
        check(L.dsv4_backend_create_with(plan, ck, ctypes.byref(opt), ctypes.byref(b), ctypes.byref(err)), err)
        self._b = b
        with _LAYERS_LOCK:
            self.handle = _NEXT[0]
            _NEXT[0] += 1
            _LAYERS[self.handle] = self

    # ------------------------------------------------------------------ config

    def _make_config(self, config, err):
        L = self._lib
        keys = {}
        if isinstance(config, dict):
            keys = dict(config)
            base = keys.pop("preset", None)
        else:
            base = config
        if base is None:
            L.dsv4_config_init(self._cfg)
        elif isinstance(base, (str, os.PathLike)) and os.path.isfile(os.fspath(base)):
            L.dsv4_config_init(self._cfg)
            check(L.dsv4_config_load_file(self._cfg, os.fsencode(os.fspath(base)), ctypes.byref(err)), err)
        else:
            check(L.dsv4_config_preset(str(base).encode(), self._cfg, ctypes.byref(err)), err)
        size = int.from_bytes(self._cfg.raw[:4], "little")
        if not 0 < size <= _lib.CONFIG_BYTES:
            raise _lib.Error(14, "dsv4_config", "the library's config is %d bytes, above this package's %d"
                             % (size, _lib.CONFIG_BYTES))
        for k, v in keys.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            check(L.dsv4_config_set(self._cfg, str(k).encode(), str(v).encode(), ctypes.byref(err)), err)

    def config_value(self, key):
        """A config value as text (dsv4_config_get)."""
        buf = ctypes.create_string_buffer(256)
        err = _lib.DsvError()
        check(self._lib.dsv4_config_get(self._cfg, key.encode(), buf, 256, ctypes.byref(err)), err)
        return buf.value.decode()

    def workspace_size(self, max_tokens):
        """dsv4_backend_workspace_size of this layer's plan (device bytes; 0 for ref and cpu)."""
        n = ctypes.c_uint64()
        err = _lib.DsvError()
        check(self._lib.dsv4_backend_workspace_size(self._plan, int(max_tokens), ctypes.byref(n), ctypes.byref(err)),
              err)
        return n.value

    # ------------------------------------------------------------------ forward

    def __call__(self, x, input_ids=None, valid_tokens=None):
        """(y, topk_ids, topk_weights); see the module's documentation."""
        if self._b is None:
            raise ValueError("the layer is closed")
        if _is_torch(x):
            from . import torch_ops
            torch_ops.register()
            import torch
            return torch.ops.dsv4moe.moe(self.handle, x, input_ids, valid_tokens)
        if valid_tokens is not None:
            raise ValueError("valid_tokens is for device tensors (the stream-ordered forward)")
        return self.forward_numpy(x, input_ids)

    def forward_numpy(self, x, input_ids=None):
        """The host forward (dsv4_backend_forward) on NumPy arrays."""
        a = np.asarray(x)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError("x has shape %s; the layer takes [T, %d]" % (a.shape, self.dim))
        bits_in = a.dtype == np.uint16
        if bits_in:
            xb = np.ascontiguousarray(a)
        elif a.dtype.kind == "f":
            from .testing import to_bf16_bits
            xb = to_bf16_bits(a)
        else:
            raise TypeError("x dtype %s: bf16 bits (uint16) or a float array" % a.dtype)
        T, K = xb.shape[0], self.n_activated
        ids = None
        if input_ids is not None:
            ids = np.ascontiguousarray(np.asarray(input_ids), dtype=np.int32).reshape(-1)
            if ids.shape[0] != T:
                raise ValueError("input_ids has %d entries for %d tokens" % (ids.shape[0], T))
        y = np.empty((max(T, 1), self.dim), np.uint16)[:T]  # a T = 0 call still hands the library a y pointer
        tk = np.empty((T, K), np.int32)
        tw = np.empty((T, K), np.float32)
        out = _lib.ForwardOut(y.ctypes.data, tk.ctypes.data, tw.ctypes.data, None)
        err = _lib.DsvError()
        check(self._lib.dsv4_backend_forward(self._b, T, xb.ctypes.data if T else None,
                                             ids.ctypes.data if ids is not None else None, ctypes.byref(out),
                                             ctypes.byref(err)), err)
        if not bits_in:
            from .testing import from_bf16_bits
            y = from_bf16_bits(y)
        return y, tk, tw

    def enqueue(self, stream, tokens, x_ptr, input_ids_ptr, y_ptr, topk_ids_ptr=None, topk_weights_ptr=None,
                valid_tokens_ptr=None):
        """dsv4_backend_enqueue with raw device pointers (ints) on a stream handle (int, 0: legacy)."""
        out = _lib.ForwardOut(y_ptr, topk_ids_ptr, topk_weights_ptr, None)
        err = _lib.DsvError()
        check(self._lib.dsv4_backend_enqueue(self._b, stream or None, int(tokens), valid_tokens_ptr or None,
                                             x_ptr or None, input_ids_ptr or None, ctypes.byref(out),
                                             ctypes.byref(err)), err)

    def poll_error(self, stream=None):
        """Waits for stream (a handle or a torch stream; None: the device), reads and clears the device
        error word: raises dsv4moe.Error (status 6 bad ids, 11 non-finite rows, 14 bad expert ids),
        returns the counts as a dict otherwise."""
        if stream is not None and hasattr(stream, "cuda_stream"):
            stream = stream.cuda_stream
        d = _lib.DeviceErrors()
        d.struct_size = ctypes.sizeof(d)
        err = _lib.DsvError()
        st = self._lib.dsv4_backend_poll_error(self._b, stream or None, ctypes.byref(d), ctypes.byref(err))
        counts = {"bad_input_ids": d.bad_input_ids, "first_bad_input": d.first_bad_input,
                  "nonfinite_rows": d.nonfinite_rows, "bad_expert_ids": d.bad_expert_ids}
        if st:
            e = _lib.Error(st, err.where.decode(errors="replace"), err.message.decode(errors="replace"))
            e.counts = counts
            raise e
        return counts

    @property
    def backend_name(self):
        return self._lib.dsv4_backend_name(self._b).decode()

    # ------------------------------------------------------------------ life

    def close(self):
        """Frees the backend, the plan and the checkpoint (then the private checkpoint file)."""
        L = getattr(self, "_lib", None)
        if L is None:
            return
        if getattr(self, "_b", None):
            L.dsv4_backend_free(self._b)
        if getattr(self, "_plan", None):
            L.dsv4_plan_free(self._plan)
        if getattr(self, "_ck", None):
            L.dsv4_checkpoint_close(self._ck)
        self._b = self._plan = self._ck = None
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        with _LAYERS_LOCK:
            _LAYERS.pop(getattr(self, "handle", None), None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def layer_of(handle):
    """The live Layer of a handle (the custom op's first argument)."""
    layer = _LAYERS.get(int(handle))
    if layer is None:
        raise ValueError("no live dsv4moe.Layer has handle %d" % handle)
    return layer
