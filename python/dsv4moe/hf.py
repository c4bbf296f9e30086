"""HF transformers integration: ``dsv4moe.hf.patch(model_or_block, gemm="fp8")`` runs every
``DeepseekV4SparseMoeBlock`` of a model (or one block) on dsv4moe's fast path (docs/embedding.md).

Each block's own weights are written once, at patch time, as a checkpoint in the stacked layout
(HF's own key names, ``model.layers.<i>.mlp.``; bf16) and opened by a dsv4moe.Layer whose config
is the block's: dims, experts, top-k, ``routed_scaling_factor`` (route_scale), ``scoring_func``,
``swiglu_limit`` (routed and, where this transformers version's DeepseekV4MLP clamps, shared),
the hash layers (``mlp_layer_types`` / ``num_hash_layers``, the block's ``tid2eid``), the weight
point HF computes (after down_proj) and no norm top-p (HF's router has none). With quantized
formats (``formats="fp4"``: routed fp4 / shared fp8 / ue8m0 activations, the release's) the
library quantizes the bf16 experts while it loads them, with the project's quantizers
(core/formats.c), exactly as ``dsv4moe ref`` does from the same file: ``block.dsv4moe_checkpoint``
and ``block.dsv4moe_config`` name the file and the config, so the reference on "the weights the
patch quantized" is one ``dsv4moe ref`` call away. ``formats="bf16"`` keeps the weights as they are.

A block whose experts are held in a quantized torch dtype (fp8 / packed fp4 parameters) is refused
with NotImplementedError: their scale layout is not HF's to define yet, so it is not guessed here.

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
    """The dsv4moe config (a dict of SPEC.md section 8 keys) of one HF block."""
    if formats not in FORMATS:
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
    c.update(FORMATS[formats])
    c["gemm"] = "exact" if formats == "bf16" else gemm
    return c


def block_tensors(block, layer):
    """{key: torch tensor on the host} in the stacked layout (HF's names under model.layers.<i>.mlp.)."""
    import torch
    prefix = "model.layers.%d.mlp." % layer
    out = {}
    for k, v in block.state_dict().items():
        if str(v.dtype) not in _FLOATS and not k.endswith("tid2eid"):
            raise NotImplementedError("%s%s is held as %s: quantized HF expert tensors are not read by this patch "
                                      "(load the block in bf16; dsv4moe quantizes it itself)" % (prefix, k, v.dtype))
        v = v.detach().cpu()
        if k.endswith("tid2eid"):
            v = v.to(torch.int32)
        elif k.endswith("e_score_correction_bias"):
            v = v.to(torch.float32)
        else:
            v = v.to(torch.bfloat16)
        out[prefix + k] = v.contiguous()
    return out


def patch(model_or_block, gemm="fp8", formats="fp4", backend=None, max_tokens=16384, threads=8, workdir=None):
    """Replaces the forward of each DeepseekV4SparseMoeBlock with a dsv4moe.Layer built from the
    block's weights and config; returns the list of (layer, block). gemm: "fp8" or "exact" (for
    quantized formats; bf16 runs exact). backend: "cuda" / "cpu" / "ref" (default: cuda for a block
    on a CUDA device, cpu otherwise)."""
    from .layer import Layer
    from .testing import write_safetensors
    from .layer import tensor_to_numpy
    hf_config = getattr(model_or_block, "config", None)
    done = []
    for layer, block in _blocks(model_or_block):
        if getattr(block, "dsv4moe_layer_obj", None) is not None:
            done.append((layer, block))
            continue
        cfg = getattr(block, "config", None) or hf_config or getattr(block.gate, "config", None)
        if cfg is None:
            raise ValueError("block %d: no HF config found (pass the model, or set block.config)" % layer)
        conf = block_config(block, cfg, layer, formats, gemm)
        dev = next(block.parameters()).device
        be = backend or ("cuda" if dev.type == "cuda" else "cpu")
        d = workdir or tempfile.mkdtemp(prefix="dsv4moe-hf-")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "layer%d.safetensors" % layer)
        write_safetensors(path, {k: tensor_to_numpy(v) for k, v in block_tensors(block, layer).items()},
                          {"generator": "dsv4moe.hf.patch", "layer": str(layer)})
        m = Layer(conf, path, backend=be, threads=threads, max_tokens=max_tokens)
        block.dsv4moe_layer_obj = m
        block.dsv4moe_checkpoint = path
        block.dsv4moe_config = conf
        block.dsv4moe_hf_forward = block.forward
        block.forward = _patched_forward(block, m)
        done.append((layer, block))
    return done


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
