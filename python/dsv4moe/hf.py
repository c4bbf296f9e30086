"""HF transformers integration: ``dsv4moe.hf.patch(model_or_block, gemm="fp8")`` runs every
``DeepseekV4SparseMoeBlock`` of a model (or one block) on dsv4moe's fast path (docs/embedding.md).

Each block's own weights are written once, at patch time, as a checkpoint and opened by a
dsv4moe.Layer whose config is the block's: dims, experts, top-k, ``routed_scaling_factor``
(route_scale), ``scoring_func``, ``swiglu_limit`` (routed and, where this transformers version's
DeepseekV4MLP clamps, shared), the hash layers (``mlp_layer_types`` / ``num_hash_layers``, the
block's ``tid2eid``), the weight point HF computes (after down_proj) and no norm top-p (HF's router
has none). ``block.dsv4moe_checkpoint`` and ``block.dsv4moe_config`` name the file and the config, so
the reference on the patched block's weights is one ``dsv4moe ref`` call away.

Two kinds of blocks:

- bf16 (or fp32) experts: written in the stacked layout (HF's key names, ``model.layers.<i>.mlp.``,
  bf16). With quantized formats (``formats="fp4"``, the default: routed fp4 / shared fp8 / ue8m0
  activations, the release's) the library quantizes them while it loads them, with the project's
  quantizers (core/formats.c), exactly as ``dsv4moe ref`` does from the same file; ``formats="bf16"``
  keeps them as they are.
- quantized experts, as HF holds them after loading the official fp8/fp4 checkpoint without
  dequantizing (packed fp4 with ue8m0 1x32 scales, or e4m3 with 128x128 block scales, in the fine-grained
  FP8 quantizer's FP8Experts / FineGrainedExperts and fp8 linears; dsv4moe.hf_layout says exactly what
  is read and where transformers defines it): their bytes are written in the
  split layout (the official key names, ``layers.<i>.ffn.``) as they are, only the layout moved (gate
  and up rows de-interleaved, experts unstacked), and the config takes the formats the block holds
  (routed_format, shared_format, weight_scale, act_quant: ue8m0 activations with ue8m0 weight scales,
  fp32 with fp32 ones). No dequantize/requantize round trip: what the formats cannot hold exactly is
  refused (hf_layout.LayoutError naming the tensor and the rule), and ``formats`` other than None
  that disagree with the held formats are refused too.

``checkpoint=`` (a safetensors file or folder in the split layout, e.g. the official release) makes
every block read its layer's tensors from there instead of from the block, whatever HF holds (a
model dequantized to bf16 at load keeps its bf16 copy, the fast path gets the release's exact fp4 /
fp8 tensors); the formats are the file's.

The patched forward takes the block's ``(hidden_states [B, S, H], input_ids)``, runs the layer on
the block's device (backend "cuda" for CUDA parameters, "cpu" otherwise) in bf16 and returns y in
the input's dtype. ``unpatch(model_or_block)`` restores HF's forward.
"""

import inspect
import os
import tempfile

BLOCK_CLASS = "DeepseekV4SparseMoeBlock"
_FLOATS = ("torch.bfloat16", "torch.float16", "torch.float32", "torch.float64")


def _blocks(model_or_block):
    """[(layer index, block)] of a block or of every block inside a model."""
    if type(model_or_block).__name__ == BLOCK_CLASS:
        return [(_layer_index(model_or_block, None), model_or_block)]
    out = []
    for name, mod in model_or_block.named_modules():
        if type(mod).__name__ == BLOCK_CLASS:
            out.append((_layer_index(mod, name), mod))
    if not out:
        raise ValueError("no %s in %s" % (BLOCK_CLASS, type(model_or_block).__name__))
    return out


def _layer_index(block, name):
    """The block's layer id: its module path (layers.<i>.mlp), or block.layer_idx / dsv4moe_layer."""
    for attr in ("dsv4moe_layer", "layer_idx"):
        if isinstance(getattr(block, attr, None), int):
            return getattr(block, attr)
    if name:
        parts = name.split(".")
        for i, p in enumerate(parts[:-1]):
            if p == "layers" and parts[i + 1].isdigit():
                return int(parts[i + 1])
    raise ValueError("cannot tell the layer id of a %s (%s): set block.dsv4moe_layer = i before patching"
                     % (BLOCK_CLASS, name or "a bare block"))


def _shared_clamps(block):
    """Whether this transformers version's shared expert clamps (read from its forward's source)."""
    try:
        return "clamp" in inspect.getsource(type(block.shared_experts).forward)
    except (OSError, TypeError):
        return True


def _cfg(hf, *names, default=None):
    for n in names:
        v = getattr(hf, n, None)
        if v is not None:
            return v
    if default is not None:
        return default
    raise ValueError("the HF config has none of %s" % (names,))


FORMATS = {
    "bf16": {"routed_format": "bf16", "shared_format": "bf16", "act_quant": "none"},
    "fp4": {"routed_format": "fp4", "shared_format": "fp8", "act_quant": "ue8m0"},
    "fp8": {"routed_format": "fp8", "shared_format": "fp8", "act_quant": "ue8m0"},
}


def block_config(block, hf_config, layer, formats="fp4", gemm="fp8"):
    """The dsv4moe config (a dict of SPEC.md section 8 keys) of one HF block. formats: a name of
    FORMATS or a dict of routed_format, shared_format, weight_scale, act_quant (what a block holds)."""
    if isinstance(formats, dict):
        fmt = dict(formats)
    elif formats in FORMATS:
        fmt = FORMATS[formats]
    else:
        raise ValueError("formats %r: one of %s" % (formats, ", ".join(FORMATS)))
    n_layers = int(_cfg(hf_config, "num_hidden_layers"))
    types = getattr(hf_config, "mlp_layer_types", None)
    if types:
        n_hash = sum(1 for t in types if t == "hash_moe")
        if any(t == "hash_moe" for t in types[n_hash:]):
            raise ValueError("hash layers after routed ones (mlp_layer_types %s): dsv4moe's hash layers are the "
                             "first n_hash_layers" % types)
    else:
        n_hash = int(_cfg(hf_config, "num_hash_layers", default=0))
    if bool(getattr(block, "is_hash", layer < n_hash)) != (layer < n_hash):
        raise ValueError("block %d: is_hash %s disagrees with the config's hash layers (%d)"
                         % (layer, getattr(block, "is_hash", None), n_hash))
    limit = float(_cfg(hf_config, "swiglu_limit", default=0.0))
    c = {
        "dim": int(_cfg(hf_config, "hidden_size")),
        "moe_inter_dim": int(_cfg(hf_config, "moe_intermediate_size", "intermediate_size")),
        "n_routed_experts": int(_cfg(hf_config, "n_routed_experts", "num_local_experts")),
        "n_activated": int(_cfg(hf_config, "num_experts_per_tok")),
        "n_shared_experts": int(_cfg(hf_config, "n_shared_experts", default=1)),
        "vocab_size": int(_cfg(hf_config, "vocab_size")),
        "n_layers": n_layers,
        "n_hash_layers": n_hash,
        "layer": int(layer),
        "route_scale": float(_cfg(hf_config, "routed_scaling_factor", default=1.0)),
        "score_func": str(_cfg(hf_config, "scoring_func")),
        "swiglu_limit": limit,
        "shared_clamp": _shared_clamps(block),
        "weight_point": "after_w2",  # HF: F.linear(h, down_proj[e]) * weight
        "top_p": 1.0,                 # HF's router keeps every top-k slot
    }
    c.update(fmt)
    quantized = fmt["routed_format"] != "bf16" or (c["n_shared_experts"] and fmt["shared_format"] != "bf16")
    c["gemm"] = gemm if quantized else "exact"
    return c


def block_tensors(block, layer):
    """{key: torch tensor on the host} in the stacked layout (HF's names under model.layers.<i>.mlp.)."""
    import torch
    prefix = "model.layers.%d.mlp." % layer
    out = {}
    for k, v in block.state_dict().items():
        if str(v.dtype) not in _FLOATS and not k.endswith("tid2eid"):
            raise NotImplementedError("%s%s is held as %s in a block whose experts are float: the bf16 path writes "
                                      "float tensors only" % (prefix, k, v.dtype))
        v = v.detach().cpu()
        if k.endswith("tid2eid"):
            v = v.to(torch.int32)
        elif k.endswith("e_score_correction_bias"):
            v = v.to(torch.float32)
        else:
            v = v.to(torch.bfloat16)
        out[prefix + k] = v.contiguous()
    return out


def block_arrays(block):
    """{state_dict name: (safetensors dtype, numpy array)} of a block on the host, bytes as held."""
    from .layer import tensor_to_numpy
    out = {}
    for k, v in block.state_dict().items():
        try:
            out[k] = tensor_to_numpy(v)
        except TypeError:
            raise NotImplementedError("%s is held as %s, which dsv4moe.hf does not read" % (k, v.dtype)) from None
    return out


def _interleaved(block):
    """Whether the block's experts hold gate_up's rows interleaved (HF's finegrained experts do)."""
    ex = getattr(block, "experts", None)
    impl = getattr(getattr(ex, "config", None), "_experts_implementation", None)
    if getattr(ex, "_megamoe_transformed", False) or impl == "deepgemm_megamoe":
        raise NotImplementedError("the block's experts are held for DeepGEMM's Mega MoE (experts_implementation="
                                  "\"deepgemm_megamoe\": weights and UE8M0 scales transformed in place by "
                                  "transform_weights_for_mega_moe, not the checkpoint's layout); load with "
                                  "experts_implementation=\"deepgemm\" or \"eager\" to patch it")
    if getattr(ex, "has_gate", True) is False:
        raise NotImplementedError("the block's experts have no gate projection (up_proj only); DeepSeek-V4 gates")
    return bool(getattr(ex, "holds_interleaved_gate_up", False))


def held_checkpoint(block, hf_config, layer):
    """(formats, split-layout tensors) of a block holding quantized experts; (None, None) for a float one."""
    from .hf_layout import split_checkpoint
    experts = [v for k, v in block.state_dict().items() if k.startswith(("experts.", "shared_experts."))]
    if all(v.is_floating_point() and v.element_size() > 1 for v in experts):
        return None, None  # the bf16 path; nothing to copy twice
    dims = block_config(block, hf_config, layer, "bf16")
    return split_checkpoint(block_arrays(block), layer, dims, interleaved=_interleaved(block))


def checkpoint_formats(path, layer):
    """The formats (routed_format, shared_format, weight_scale, act_quant) of one layer of a split-layout
    safetensors file or folder, read from the headers only."""
    import json
    import struct
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    dtypes = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            hdr = json.loads(fh.read(n).decode("utf-8"))
        for k, v in hdr.items():
            if k != "__metadata__":
                dtypes[k] = v.get("dtype")
    pre = "layers.%d.ffn." % layer
    kinds = {"BF16": "bf16", "F8_E4M3": "fp8", "I8": "fp4", "U8": "fp4"}
    routed = dtypes.get(pre + "experts.0.w1.weight")
    if routed not in kinds:
        raise ValueError("%s: no %sexperts.0.w1.weight in the split layout (found dtype %r); the explicit checkpoint "
                         "is the official release's layout (layers.<i>.ffn.*)" % (path, pre, routed))
    shared = dtypes.get(pre + "shared_experts.w1.weight", "BF16")
    if shared not in ("BF16", "F8_E4M3"):
        raise ValueError("%s: %sshared_experts.w1.weight is %s; the shared expert is bf16 or fp8" % (path, pre, shared))
    scales = {dtypes.get(k) for k in dtypes if k.startswith(pre) and k.endswith(".scale")
              and dtypes.get(k[:-len(".scale")] + ".weight") == "F8_E4M3"}
    if len(scales) > 1:
        raise ValueError("%s: layer %d's fp8 scales are held as %s; one weight_scale per layer (SPEC.md section 8)"
                         % (path, layer, sorted(scales)))
    ws = "fp32" if scales == {"F32"} else "ue8m0"
    return {"routed_format": kinds[routed], "shared_format": kinds[shared], "weight_scale": ws,
            "act_quant": "fp32" if ws == "fp32" and scales else "ue8m0"}


def patch(model_or_block, gemm="fp8", formats=None, backend=None, max_tokens=16384, threads=8, workdir=None,
          checkpoint=None):
    """Replaces the forward of each DeepseekV4SparseMoeBlock with a dsv4moe.Layer built from the
    block's weights and config; returns the list of (layer, block). gemm: "fp8" or "exact" (for
    quantized formats; bf16 runs exact). formats: for float blocks "fp4" (None: the default), "fp8" or
    "bf16"; blocks holding quantized experts run in the formats they hold (a different name is
    refused). backend: "cuda" / "cpu" / "ref" (default: cuda for a block on a CUDA device, cpu
    otherwise). checkpoint: a split-layout safetensors file or folder the layers read instead of the
    blocks' own weights (see the module's documentation)."""
    from .layer import Layer
    from .testing import write_safetensors
    from .layer import tensor_to_numpy
    hf_config = getattr(model_or_block, "config", None)
    if formats is not None and formats not in FORMATS:
        raise ValueError("formats %r: one of %s, or None" % (formats, ", ".join(FORMATS)))
    done = []
    for layer, block in _blocks(model_or_block):
        if getattr(block, "dsv4moe_layer_obj", None) is not None:
            done.append((layer, block))
            continue
        cfg = getattr(block, "config", None) or hf_config or getattr(block.gate, "config", None)
        if cfg is None:
            raise ValueError("block %d: no HF config found (pass the model, or set block.config)" % layer)
        dev = next(block.parameters()).device
        be = backend or ("cuda" if dev.type == "cuda" else "cpu")
        if checkpoint is not None:
            held = checkpoint_formats(checkpoint, layer)
            _same_formats(held, formats, layer, "the checkpoint %s holds" % checkpoint)
            conf = block_config(block, cfg, layer, held, gemm)
            path = checkpoint
        else:
            held, tensors = held_checkpoint(block, cfg, layer)
            d = workdir or tempfile.mkdtemp(prefix="dsv4moe-hf-")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "layer%d.safetensors" % layer)
            if held is None:
                conf = block_config(block, cfg, layer, formats or "fp4", gemm)
                tensors = {k: tensor_to_numpy(v) for k, v in block_tensors(block, layer).items()}
            else:
                _same_formats(held, formats, layer, "the block holds")
                conf = block_config(block, cfg, layer, held, gemm)
            write_safetensors(path, tensors, {"generator": "dsv4moe.hf.patch", "layer": str(layer),
                                              "held": "quantized" if held else "float"})
        m = Layer(conf, path, backend=be, threads=threads, max_tokens=max_tokens)
        block.dsv4moe_layer_obj = m
        block.dsv4moe_checkpoint = path
        block.dsv4moe_config = conf
        block.dsv4moe_hf_forward = block.forward
        block.forward = _patched_forward(block, m)
        done.append((layer, block))
    return done


def _same_formats(held, formats, layer, what):
    """Refuses a formats name that would requantize held quantized tensors."""
    if formats is None:
        return
    want = FORMATS[formats]
    if (want["routed_format"], want["shared_format"]) != (held["routed_format"], held["shared_format"]):
        raise ValueError("block %d: %s routed %s / shared %s weights; formats=%r would convert them to routed %s / "
                         "shared %s, a requantization dsv4moe.hf does not do: pass formats=None"
                         % (layer, what, held["routed_format"], held["shared_format"], formats,
                            want["routed_format"], want["shared_format"]))


def _patched_forward(block, layer):
    import torch

    def forward(hidden_states, input_ids=None, **_):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()
        ids = None
        if layer.hash_layer:
            if input_ids is None:
                raise ValueError("a hash-routed layer needs input_ids")
            ids = input_ids.reshape(-1).to(device=x.device, dtype=torch.int32)
        y, _, _ = layer(x, ids)
        return y.to(hidden_states.dtype).view(shape)
    return forward


def unpatch(model_or_block):
    """Restores HF's forward of each patched block and frees its layer."""
    for _, block in _blocks(model_or_block):
        m = getattr(block, "dsv4moe_layer_obj", None)
        if m is None:
            continue
        block.forward = block.dsv4moe_hf_forward
        m.close()
        block.dsv4moe_layer_obj = None
