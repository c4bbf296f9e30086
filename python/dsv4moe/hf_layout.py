"""The tensors an HF DeepseekV4SparseMoeBlock holds after loading a quantized checkpoint, laid out as
dsv4moe's split checkpoint (SPEC.md sections 5 and 6) with the same bytes: layout only, never a
requantization. Plain NumPy (torch is not needed; ``dsv4moe.hf`` hands the block's tensors in).

What HF transformers holds after loading DeepSeek-V4's ``quant_method: fp8`` checkpoint without
``dequantize`` (the fine-grained FP8 quantizer; two generations of its modules, same names):
``src/transformers/integrations/finegrained_fp8.py`` ``FP8Experts`` / ``FP8Linear`` (packed fp4
experts when ``config.expert_dtype == "fp4"``, gate|up rows stacked, scales float8_e8m0fnu under
``scale_fmt: ue8m0`` else float32) and ``src/transformers/integrations/finegrained/core.py``
``FineGrainedExperts`` / ``FineGrainedLinear`` (formats per module group, gate|up rows interleaved):

- routed experts: ``gate_up_proj`` [E, 2I, H / v] and ``down_proj`` [E, H, I / v]
  with ``<proj>_scale_inv`` grids, one of
  * fp4 (the release's routed experts, ``mxfp4``): packed e2m1 as ``int8``, two values a byte, low
    nibble first (the checkpoint's bytes, bitcast), v = 2, scales [E, N, K / 32] (``float8_e8m0fnu``,
    or float32 powers of two, converted back exactly);
  * ``fp8`` (V4-Flash-Base): ``float8_e4m3fn``, v = 1, scales [E, ceil(N / 128), ceil(K / 128)] in
    float32 or ``float8_e8m0fnu`` (``scale_fmt: ue8m0``), or one per-tensor scale [E, 1 or 2, 1];
  gate_up's rows are held interleaved ``[g0, u0, g1, u1, ...]`` when the module says
  ``holds_interleaved_gate_up`` (the loader's ``Interleave(dim=1)`` over the weight and its scale
  grid alike), else stacked ``[gate; up]``;
- the shared expert, three fp8 linears: ``weight`` e4m3 [N, K] and ``weight_scale_inv``
  [ceil(N / 128), ceil(K / 128)] (float32 or e8m0), block [128, 128];
- the router as in a bf16 model (``gate.weight``, ``gate.e_score_correction_bias`` fp32 or
  ``gate.tid2eid`` int64).

dsv4moe's formats (SPEC.md section 5): fp4 [N, K / 2] bytes, low nibble the even k, ue8m0 scales
[N, K / 32]; fp8 e4m3 [N, K] with one scale per 128x128 block, every fp8 tensor of a layer in one
scale format (``weight_scale`` ue8m0 or fp32). So the fp4 experts and 128x128 fp8 blocks pass as
they are; an e8m0 scale next to fp32 ones becomes the same power of two in fp32 (exact); a
per-tensor scale is repeated over the blocks (exact). What the formats cannot hold exactly (another
block size, NVFP4's e4m3 group-16 scales with a global, MXFP8's 1x32 groups, swizzled SM100 scale
grids, static activation scales, biases) is refused with an error naming the tensor and the rule.

Arrays are ``(safetensors dtype, numpy array)`` pairs as dsv4moe.testing reads and writes them:
BF16 as uint16 bits, F8_E4M3 and F8_E8M0 as uint8 bytes.
"""

import numpy as np

FLOATS = ("BF16", "F16", "F32", "F64")
FP4_GROUP = 32
FP8_BLOCK = 128

# The slots of a finegrained module that SPEC.md's layer has no place for (HF names them
# <proj><slot>); a block holding any of them is refused.
_EXTRA_SLOTS = ("_bias", "_weight_global_scale", "_input_global_scale", "_activation_scale")


class LayoutError(ValueError):
    """A held tensor dsv4moe's formats cannot represent exactly; the message names it and the rule."""


def _cdiv(a, b):
    return (a + b - 1) // b


def e8m0_to_f32(b, name):
    """ue8m0 bytes -> their exact float32 powers of two 2^(b - 127); byte 255 (NaN) is an error."""
    b = np.asarray(b, dtype=np.uint8)
    if (b == 255).any():
        i = np.unravel_index(int(np.argmax(b == 255)), b.shape)
        raise LayoutError("%s: scale %s is the e8m0 NaN byte 255; a weight scale must be a number" % (name, list(i)))
    return np.ldexp(np.float32(1.0), b.astype(np.int32) - 127).astype(np.float32)


def f32_to_e8m0(f, name):
    """float32 powers of two -> their ue8m0 bytes (exact); any other value is an error naming it."""
    f = np.asarray(f, dtype=np.float32)
    m, e = np.frexp(f)
    ok = np.isfinite(f) & (m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)
    if not ok.all():
        i = np.unravel_index(int(np.argmax(~ok)), f.shape)
        raise LayoutError("%s: scale %s is %r, not a power of two in [2^-127, 2^127]: fp4 scales are ue8m0 "
                          "(SPEC.md section 5), so it cannot be represented exactly" % (name, list(i), float(f[i])))
    return (e.astype(np.int32) - 1 + 127).astype(np.uint8)


def _bf16_exact(a, name):
    """float values -> bf16 bits, refused where the value is not a bf16 value (the router is bf16)."""
    from .testing import to_bf16_bits, from_bf16_bits
    f = np.asarray(a, dtype=np.float32)
    bits = to_bf16_bits(f)
    back = from_bf16_bits(bits)
    bad = ~((back == f) | (np.isnan(back) & np.isnan(f)))
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), f.shape)
        raise LayoutError("%s: element %s is %.9g, not a bf16 value; SPEC.md section 6 holds this tensor in bf16"
                          % (name, list(i), float(f[i])))
    return bits


def as_bf16(entry, name):
    dt, a = entry
    if dt == "BF16":
        return np.ascontiguousarray(a, dtype=np.uint16)
    if dt in ("F16", "F32", "F64"):
        return _bf16_exact(a, name)
    raise LayoutError("%s is %s; expected a float tensor (bf16)" % (name, dt))


def as_f32(entry, name):
    dt, a = entry
    if dt == "F32":
        return np.ascontiguousarray(a, dtype=np.float32)
    if dt == "BF16":
        from .testing import from_bf16_bits
        return from_bf16_bits(a)
    if dt in ("F16",):
        return np.asarray(a, dtype=np.float32)
    if dt == "F64":
        f = np.asarray(a, dtype=np.float32)
        if not (f.astype(np.float64) == np.asarray(a)).all():
            raise LayoutError("%s holds float64 values that are not float32 values" % name)
        return f
    raise LayoutError("%s is %s; expected a float tensor" % (name, dt))


def deinterleave(a, axis):
    """The gate and up halves of rows held ``[g0, u0, g1, u1, ...]`` along ``axis``."""
    a = np.asarray(a)
    if a.shape[axis] % 2:
        raise LayoutError("an interleaved gate|up axis of odd length %d" % a.shape[axis])
    sl = [slice(None)] * a.ndim
    sl[axis] = slice(0, None, 2)
    g = a[tuple(sl)]
    sl[axis] = slice(1, None, 2)
    return np.ascontiguousarray(g), np.ascontiguousarray(a[tuple(sl)])


def destack(a, axis, rows):
    """The gate and up halves of rows held ``[gate; up]`` (``rows`` each) along ``axis``."""
    a = np.asarray(a)
    if a.shape[axis] != 2 * rows:
        raise LayoutError("a stacked gate|up axis of %d rows, expected 2 x %d" % (a.shape[axis], rows))
    return (np.ascontiguousarray(np.take(a, range(rows), axis=axis)),
            np.ascontiguousarray(np.take(a, range(rows, 2 * rows), axis=axis)))


class Scale:
    """A held fp8 scale grid as dsv4moe needs it: ``kind`` "e8m0" (uint8 bytes) or "f32"."""

    def __init__(self, kind, a):
        self.kind, self.a = kind, a

    def entry(self, weight_scale, name):
        if weight_scale == "ue8m0":
            e8m0_to_f32(self.a, name)  # refuses the NaN byte
            return ("F8_E8M0", np.ascontiguousarray(self.a, dtype=np.uint8))
        if self.kind == "e8m0":
            return ("F32", e8m0_to_f32(self.a, name))
        f = np.ascontiguousarray(self.a, dtype=np.float32)
        if not np.isfinite(f).all():
            i = np.unravel_index(int(np.argmax(~np.isfinite(f))), f.shape)
            raise LayoutError("%s: scale %s is %r; a weight scale must be finite" % (name, list(i), float(f[i])))
        return ("F32", f)


def _fp8_scale(entry, name):
    dt, a = entry
    if dt in ("F8_E8M0", "U8"):
        return Scale("e8m0", np.asarray(a, dtype=np.uint8))
    if dt in ("F32", "BF16", "F16", "F64"):
        return Scale("f32", as_f32(entry, name))
    raise LayoutError("%s is %s: an fp8 weight scale is float32 or e8m0 (SPEC.md section 5)" % (name, dt))


def _block_grid(scale, lead, n, k, name):
    """An fp8 scale grid ``lead + [ceil(n/128), ceil(k/128)]`` from the held one: the 128x128 grid as
    it is, a per-tensor scale (trailing [1, 1]) repeated over every block; anything else refused."""
    a = scale.a
    want = tuple(lead) + (_cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK))
    if a.ndim == 5:
        raise LayoutError("%s is held swizzled %s (SWIZZLE_32_4_4, SM100 with a triton experts backend): load with "
                          "experts_implementation=\"deepgemm\" or \"eager\" so the scales stay row-major" % (name, a.shape))
    if tuple(a.shape) == want:
        return Scale(scale.kind, np.ascontiguousarray(a))
    if a.ndim == len(lead) + 2 and tuple(a.shape[:len(lead)]) == tuple(lead) and a.shape[-2:] == (1, 1):
        return Scale(scale.kind, np.ascontiguousarray(np.broadcast_to(a, want)))
    if a.size == 1 and not lead:
        return Scale(scale.kind, np.full(want, a.reshape(()), dtype=a.dtype))
    raise LayoutError("%s has shape %s for a [%d, %d] weight: SPEC.md section 5's fp8 holds one scale per 128x128 "
                      "block (%s) or one per tensor; another block size cannot be represented exactly"
                      % (name, list(a.shape), n, k, list(want)))


def _weight_kind(dt):
    if dt in FLOATS:
        return "bf16"
    if dt == "F8_E4M3":
        return "fp8"
    if dt in ("I8", "U8"):
        return "fp4"
    return None


def _get(arrays, name):
    if name not in arrays:
        raise LayoutError("the block holds no %s" % name)
    return arrays[name]


def _check_extras(arrays, prefix):
    for k in arrays:
        leaf = k.rsplit(".", 1)[-1]
        if k.startswith(prefix) and (leaf in ("bias",) + tuple(x[1:] for x in _EXTRA_SLOTS)
                                     or any(leaf.endswith(x) for x in _EXTRA_SLOTS)):
            raise LayoutError("%s is held: SPEC.md's layer has no place for it (no biases, no NVFP4 globals, activations "
                              "quantized per token and 128-group, section 5)" % k)


def _expert_proj(arrays, proj, E, n, k, scale_names):
    """(kind, weight array, Scale or None) of one held expert projection, shapes checked."""
    wname = "experts." + proj
    dt, w = _get(arrays, wname)
    kind = _weight_kind(dt)
    if kind is None:
        raise LayoutError("%s is %s: routed experts are bf16, fp8 e4m3 or packed fp4 (SPEC.md section 5)" % (wname, dt))
    sname = next((wname + s for s in scale_names if wname + s in arrays), None)
    if kind == "bf16":
        if tuple(w.shape) != (E, n, k):
            raise LayoutError("%s has shape %s, expected [%d, %d, %d]" % (wname, list(w.shape), E, n, k))
        return kind, w, None, dt
    if sname is None:
        raise LayoutError("%s is %s but the block holds no %s_scale_inv" % (wname, dt, wname))
    sdt, s = arrays[sname]
    if kind == "fp4":
        if tuple(w.shape) != (E, n, k // 2):
            raise LayoutError("%s has shape %s; packed fp4 (two e2m1 a byte) is [%d, %d, %d]"
                              % (wname, list(w.shape), E, n, k // 2))
        if np.asarray(s).ndim == 5:
            raise LayoutError("%s is held swizzled %s (SWIZZLE_32_4_4, SM100 with a triton experts backend): load with "
                              "experts_implementation=\"deepgemm\" or \"eager\" so the scales stay row-major"
                              % (sname, list(np.asarray(s).shape)))
        if sdt not in ("F8_E8M0", "U8", "F32"):
            raise LayoutError("%s is %s: fp4 weights take ue8m0 scales (MXFP4); e4m3 group-16 scales (NVFP4) are not "
                              "SPEC.md section 5's fp4" % (sname, sdt))
        if tuple(s.shape) != (E, n, k // FP4_GROUP):
            raise LayoutError("%s has shape %s: SPEC.md section 5's fp4 holds one ue8m0 scale per 32 of K, [%d, %d, %d]"
                              % (sname, list(s.shape), E, n, k // FP4_GROUP))
        # float32 scales (FP8Experts under scale_fmt "float") hold the same powers of two
        sb = f32_to_e8m0(s, sname) if sdt == "F32" else np.asarray(s, dtype=np.uint8)
        return kind, np.asarray(w).view(np.uint8), Scale("e8m0", sb), dt
    if tuple(w.shape) != (E, n, k):
        raise LayoutError("%s has shape %s, expected [%d, %d, %d]" % (wname, list(w.shape), E, n, k))
    s = np.asarray(s)
    if s.ndim == 3 and s.shape[1:] == (n, k // FP4_GROUP):
        raise LayoutError("%s holds 1x32 scales of e4m3 weights (MXFP8): SPEC.md section 5's fp8 has one scale per "
                          "128x128 block" % sname)
    grids = [(E, _cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK)), (E, 1, 1)] + ([(E, 2, 1)] if proj == "gate_up_proj" else [])
    if s.ndim == 5:
        raise LayoutError("%s is held swizzled %s (SWIZZLE_32_4_4): load with experts_implementation=\"deepgemm\" or "
                          "\"eager\" so the scales stay row-major" % (sname, list(s.shape)))
    if tuple(s.shape) not in grids:
        raise LayoutError("%s has shape %s for [%d, %d, %d] e4m3 weights: SPEC.md section 5's fp8 holds one scale per "
                          "128x128 block (%s) or one per tensor; another block size cannot be represented exactly"
                          % (sname, list(s.shape), E, n, k, list(grids[0])))
    return kind, np.asarray(w, dtype=np.uint8), _fp8_scale((sdt, s), sname), dt


def _split_rows(w, scale, kind, rows, interleaved, name):
    """(gate weight, up weight, gate scale, up scale) of a gate_up projection, per expert axis 1."""
    if interleaved:
        gw, uw = deinterleave(w, 1)
    else:
        gw, uw = destack(w, 1, rows)
    if scale is None:
        return gw, uw, None, None
    s = scale.a
    if kind == "fp4" or s.shape[1] == 1:
        if s.shape[1] == 1:  # one per-tensor scale covers gate and up
            return gw, uw, scale, scale
        gs, us = deinterleave(s, 1) if interleaved else destack(s, 1, rows)
    elif interleaved:
        gs, us = deinterleave(s, 1)
    else:
        if s.shape[1] == 2:  # per-tensor gate and up scales
            gs, us = destack(s, 1, 1)
        else:
            if rows % FP8_BLOCK:
                raise LayoutError("%s: a 128-row scale block straddles gate and up (I = %d is not a multiple of 128)"
                                  % (name, rows))
            gs, us = destack(s, 1, rows // FP8_BLOCK)
    return gw, uw, Scale(scale.kind, gs), Scale(scale.kind, us)


def _weight_scale(scales):
    """ue8m0 when every fp8 scale is held in e8m0, fp32 as soon as one is float (e8m0 ones then convert exactly)."""
    kinds = {s.kind for s in scales}
    return "fp32" if "f32" in kinds else "ue8m0"


def split_checkpoint(arrays, layer, dims, interleaved=False):
    """The held tensors of one block ({state_dict name: (dtype, array)}) as a split-layout checkpoint.

    dims: {"dim": H, "moe_inter_dim": I, "n_routed_experts": E, "n_shared_experts": 0 or 1}.
    interleaved: the experts hold gate_up's rows interleaved (``holds_interleaved_gate_up``).
    Returns (formats, tensors): formats the config keys routed_format, shared_format, weight_scale,
    act_quant of what the block holds; tensors {key: (dtype, array)} under the official key names
    ``layers.<layer>.ffn.``. Returns (None, None) when every expert tensor is a float (the bf16 path
    of dsv4moe.hf, which quantizes at load). Raises LayoutError for what the formats cannot hold."""
    H, I, E = int(dims["dim"]), int(dims["moe_inter_dim"]), int(dims["n_routed_experts"])
    has_shared = int(dims.get("n_shared_experts", 1)) > 0
    scale_names = ("_scale_inv", "_scales_inv")
    names = ["experts.gate_up_proj", "experts.down_proj"]
    if has_shared:
        names += ["shared_experts.%s.weight" % p for p in ("gate_proj", "up_proj", "down_proj")]
    if all(_weight_kind(_get(arrays, n)[0]) == "bf16" for n in names):
        return None, None
    gu = _expert_proj(arrays, "gate_up_proj", E, 2 * I, H, scale_names)
    dn = _expert_proj(arrays, "down_proj", E, H, I, scale_names)
    shared = {}
    if has_shared:
        for p in ("gate_proj", "up_proj", "down_proj"):
            n, k = (H, I) if p == "down_proj" else (I, H)
            shared[p] = _shared_proj(arrays, p, n, k)
    kinds = {gu[0], dn[0]}
    shared_kinds = {v[0] for v in shared.values()}
    _check_extras(arrays, "experts.")
    _check_extras(arrays, "shared_experts.")
    if len(kinds) != 1:
        raise LayoutError("experts.gate_up_proj is %s and experts.down_proj %s: one routed format per layer "
                          "(SPEC.md section 8, routed_format)" % (gu[0], dn[0]))
    if len(shared_kinds) > 1:
        raise LayoutError("the shared expert's projections are held in %s: one shared format per layer "
                          "(SPEC.md section 8, shared_format)" % sorted(shared_kinds))
    if shared_kinds == {"fp4"}:
        raise LayoutError("shared_experts.gate_proj.weight is packed fp4: the shared expert is bf16 or fp8 "
                          "(SPEC.md section 8, shared_format)")
    routed = gu[0]
    shared_fmt = next(iter(shared_kinds)) if shared_kinds else "bf16"
    fp8_scales = []
    if routed == "fp8":
        fp8_scales += [gu[2], dn[2]]
    if shared_fmt == "fp8":
        fp8_scales += [v[2] for v in shared.values()]
    ws = _weight_scale(fp8_scales)
    pre = "layers.%d.ffn." % layer
    out = {}
    out.update(router_tensors(arrays, layer, E))

    gw, uw, gs, us = _split_rows(gu[1], gu[2], routed, I, interleaved, "experts.gate_up_proj_scale_inv")
    for e in range(E):
        for proj, w, s, n, k, sname in (("w1", gw[e], gs, I, H, "experts.gate_up_proj_scale_inv"),
                                        ("w3", uw[e], us, I, H, "experts.gate_up_proj_scale_inv"),
                                        ("w2", dn[1][e], dn[2], H, I, "experts.down_proj_scale_inv")):
            key = "%sexperts.%d.%s" % (pre, e, proj)
            if routed == "bf16":
                out[key + ".weight"] = ("BF16", as_bf16((dn[3] if proj == "w2" else gu[3], w), key + ".weight"))
            elif routed == "fp4":
                out[key + ".weight"] = ("I8", np.ascontiguousarray(w).view(np.int8))
                out[key + ".scale"] = s.__class__("e8m0", s.a[e]).entry("ue8m0", "%s[%d]" % (sname, e))
            else:
                out[key + ".weight"] = ("F8_E4M3", np.ascontiguousarray(w, dtype=np.uint8))
                grid = _block_grid(Scale(s.kind, s.a[e]), (), n, k, "%s[%d]" % (sname, e))
                out[key + ".scale"] = grid.entry(ws, "%s[%d]" % (sname, e))
    for p, (kind, w, s, dt) in shared.items():
        proj = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[p]
        key = "%sshared_experts.%s" % (pre, proj)
        if kind == "fp8":
            n, k = w.shape
            out[key + ".weight"] = ("F8_E4M3", np.ascontiguousarray(w, dtype=np.uint8))
            sname = "shared_experts.%s.weight_scale_inv" % p
            out[key + ".scale"] = _block_grid(s, (), n, k, sname).entry(ws, sname)
        else:
            out[key + ".weight"] = ("BF16", as_bf16((dt, w), "shared_experts.%s.weight" % p))
    fmt = {"routed_format": routed, "shared_format": shared_fmt, "weight_scale": ws,
           "act_quant": "fp32" if ws == "fp32" and fp8_scales else "ue8m0"}
    return fmt, out


def _shared_proj(arrays, p, n, k):
    """(kind, weight array, Scale or None, dtype) of one held shared-expert projection."""
    wname = "shared_experts.%s.weight" % p
    dt, w = _get(arrays, wname)
    kind = _weight_kind(dt)
    if kind is None:
        raise LayoutError("%s is %s: the shared expert is bf16 or fp8 e4m3 (SPEC.md section 5)" % (wname, dt))
    if kind == "fp4":
        return kind, w, None, dt
    if tuple(w.shape) != (n, k):
        raise LayoutError("%s has shape %s, expected [%d, %d]" % (wname, list(w.shape), n, k))
    if kind == "bf16":
        return kind, w, None, dt
    sname = "shared_experts.%s.weight_scale_inv" % p
    if sname not in arrays:
        raise LayoutError("%s is e4m3 but the block holds no %s" % (wname, sname))
    return kind, np.asarray(w, dtype=np.uint8), _fp8_scale(arrays[sname], sname), dt


def router_tensors(arrays, layer, E):
    """The router's tensors under the split layout's keys: gate.weight bf16 (exact), the selection bias
    as float32, tid2eid as int32 with every entry in [0, E)."""
    pre = "layers.%d.ffn.gate." % layer
    out = {pre + "weight": ("BF16", as_bf16(_get(arrays, "gate.weight"), "gate.weight"))}
    if "gate.tid2eid" in arrays:
        dt, t = arrays["gate.tid2eid"]
        t = np.asarray(t)
        if t.dtype.kind not in "iu":
            raise LayoutError("gate.tid2eid is %s; expected an integer table" % dt)
        bad = (t < 0) | (t >= E)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), t.shape)
            raise LayoutError("gate.tid2eid%s is %d: outside [0, %d) (SPEC.md section 2)" % (list(i), int(t[i]), E))
        out[pre + "tid2eid"] = ("I32", t.astype(np.int32))
    elif "gate.e_score_correction_bias" in arrays:
        out[pre + "bias"] = ("F32", as_f32(arrays["gate.e_score_correction_bias"], "gate.e_score_correction_bias"))
    return out


def held_from_split(tensors, layer, E, interleaved=True):
    """The inverse, for tests and the device check's stand-in: a split checkpoint's routed experts as
    HF's finegrained experts hold them ({"experts.gate_up_proj": ..., ...}, rows interleaved or stacked)
    and its shared expert as three finegrained linears. Only layout moves; dtypes stay."""
    pre = "layers.%d.ffn." % layer
    out = {}

    def stack(proj, suffix):
        ents = [tensors["%sexperts.%d.%s.%s" % (pre, e, proj, suffix)] for e in range(E)]
        return ents[0][0], np.stack([np.asarray(a) for _, a in ents])

    for suffix, name in (("weight", ""), ("scale", "_scale_inv")):
        if "%sexperts.0.w1.%s" % (pre, suffix) not in tensors:
            continue
        dt, g = stack("w1", suffix)
        _, u = stack("w3", suffix)
        if interleaved:
            gu = np.empty((E, 2 * g.shape[1]) + g.shape[2:], dtype=g.dtype)
            gu[:, 0::2], gu[:, 1::2] = g, u
        else:
            gu = np.concatenate([g, u], axis=1)
        out["experts.gate_up_proj" + name] = (dt, gu)
        out["experts.down_proj" + name] = stack("w2", suffix)
    for proj, p in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
        w = pre + "shared_experts.%s.weight" % proj
        if w in tensors:
            out["shared_experts.%s.weight" % p] = tensors[w]
            if pre + "shared_experts.%s.scale" % proj in tensors:
                out["shared_experts.%s.weight_scale_inv" % p] = tensors[pre + "shared_experts.%s.scale" % proj]
    for k, hk in (("gate.weight", "gate.weight"), ("gate.bias", "gate.e_score_correction_bias"),
                  ("gate.tid2eid", "gate.tid2eid")):
        if pre + k in tensors:
            dt, a = tensors[pre + k]
            out[hk] = ("I64", np.asarray(a).astype(np.int64)) if k == "gate.tid2eid" else (dt, a)
    return out
