"""Verifying an engine's MoE layer against cases exported by ``dsv4moe export`` (docs/engines.md).

Plain Python and NumPy; torch tensors are accepted where arrays are (converted with
``.detach().float().cpu().numpy()``), torch itself is never imported.

An engine's own pytest suite parametrizes over an exported matrix in a few lines::

    import pytest
    from dsv4moe import testing

    @pytest.mark.parametrize("case", testing.cases("exported"), ids=lambda c: c.id)
    def test_moe_layer(case):
        y, ids, w = my_engine(case.model_path, case.config, case.x, case.input_ids)
        case.check(y, topk_ids=ids, topk_weights=w, rounding="bf16_ops")   # raises CheckFailed

The rules are those of ``dsv4moe check`` (SPEC.md section 10, docs/scenarios.md "Tolerance rules"): y is
rounded to bf16 when it is wider, then held to the reference computed at the engine's rounding profile
(``rounding``: "spec", "bf16_ops" as eager PyTorch runs a bf16 model, or "fp32") by DeepGEMM diff < 1e-3
and at most 0.5 % of the elements beyond atol + rtol |b| + 2^-8 S (atol = rtol = 0.035, S the case's
y_terms; ``fp8=True``: at most 2 %); bf16 ULP figures are reported, not judged; a NaN or Inf where the
reference is finite, a non-finite reference value not repeated as the same infinity, and any NaN pair
fail. Routing ids are compared as sets per token (slot order free) in the engine's sentinel convention
("E", "-1" or "absent"); weights are matched by expert id within |a-b| <= 1e-6 + 1e-5 |b| (2^-5 |b| for an
engine at bf16_ops, whose router runs in bf16 too).

``python3 -m dsv4moe.testing D --outputs O [--rounding P]`` checks a folder of outputs as ``dsv4moe
check`` does, honouring an output's ``engine_rounding`` metadata (exit 0 all pass, 1 some fail, 2 bad
input).
"""

import json
import os
import stat as _stat
import struct
import sys

import numpy as np

FORMAT = "dsv4moe-engine-case"
FORMAT_VERSION = 3  # the version export writes; 2 (no padded cases) is read as well
ROUNDINGS = ("spec", "bf16_ops", "fp32")

ATOL = 0.035
RTOL = 0.035
TERMS_SCALE = 2.0 ** -8
WEIGHT_ATOL = 1e-6
WEIGHT_RTOL = 1e-5
# an engine at bf16_ops runs its router in bf16 too (include/dsv4moe_harness/compare.h, DSV4_ROUTING_WEIGHT_RTOL_BF16)
WEIGHT_RTOL_BF16 = 0.03125
RULES = {
    # name: (deepgemm diff bound, share of elements beyond, rms factor of the max |a-b| bound (None: no
    # such bound), whether the beyond bound has the 2^-8 S term)
    "exact-quant": (1e-3, 0.005, 0.1, False),
    "fp8-mma": (1e-3, 0.02, 0.2, False),
    "outside": (1e-3, 0.005, None, True),
    "outside-fp8-mma": (1e-3, 0.02, None, True),
}

__all__ = ["Case", "CheckFailed", "Verdict", "cases", "compare", "compare_routing", "read_safetensors",
           "write_safetensors", "to_bf16_bits", "from_bf16_bits"]


class CheckFailed(AssertionError):
    """An engine's output outside the case's tolerance; str() is the verdict line."""


class CaseError(ValueError):
    """A case folder or an output that cannot be read (dsv4moe check's exit status 2)."""


# --------------------------------------------------------------------------- safetensors

_NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
       "U8": "u1", "BOOL": "u1", "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1",
       "U16": "<u2", "U32": "<u4", "U64": "<u8"}


MAX_HEADER = 100 * 1024 * 1024  # include/dsv4moe/safetensors.h DSV4_ST_MAX_HEADER
MAX_CASE_JSON = 1 << 20          # a case.json is a few KiB; the cap keeps a hostile one from filling memory
MAX_DIMS = 8                     # DSV4_MAX_DIMS


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("duplicate key %r" % k)
        out[k] = v
    return out


def _uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64


def _plain_name(v):
    """A file name inside a case folder: a non-empty string, no '/', not hidden."""
    return isinstance(v, str) and bool(v) and not v.startswith(".") and "/" not in v and "\0" not in v


def read_safetensors(path):
    """{name: (dtype string, numpy array)}; BF16 and F8 tensors come as their raw bits (uint16 / uint8),
    the metadata under the key "__metadata__" as (None, dict). The rules of the C reader that `dsv4moe
    check` uses (core/safetensors.c): a regular file; a header of at most 100 MiB that is a JSON object
    without duplicate keys; __metadata__ an object of strings; every entry an object with a known
    dtype, a shape of at most 8 integers >= 0 and data_offsets [begin, end] spanning exactly the
    tensor's bytes; the tensors tiling the data section without gap or overlap. Anything else is
    CaseError naming the file and the rule (never another exception, a hang or a partial read)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CaseError("%s: cannot stat: %s" % (path, e.strerror)) from None
    if not _stat.S_ISREG(st.st_mode):
        raise CaseError("%s: not a regular file" % path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CaseError("%s: shorter than the 8-byte header length" % path)
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER:
                raise CaseError("%s: header length %d is 0 or exceeds the limit of %d bytes" % (path, n, MAX_HEADER))
            if n > st.st_size - 8:
                raise CaseError("%s: header length %d beyond the file" % (path, n))
            buf = head + f.read(st.st_size - 8)
    except OSError as e:
        raise CaseError("%s: cannot read: %s" % (path, e.strerror)) from None
    if len(buf) != st.st_size:
        raise CaseError("%s: the file changed while it was read" % path)
    try:
        hdr = json.loads(buf[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CaseError("%s: malformed header (%s)" % (path, e)) from None
    if not isinstance(hdr, dict):
        raise CaseError("%s: the header is %s, not a JSON object" % (path, type(hdr).__name__))
    base = 8 + n
    data_size = len(buf) - base
    out, spans = {}, []
    for k, v in hdr.items():
        if k == "__metadata__":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise CaseError("%s: __metadata__ is not an object of strings" % path)
            out[k] = (None, dict(v))
            continue
        where = "%s: tensor %r" % (path, k)
        if not k:
            raise CaseError("%s: a tensor has an empty name" % path)
        if not isinstance(v, dict) or not all(x in v for x in ("dtype", "shape", "data_offsets")):
            raise CaseError("%s: not an object with dtype, shape and data_offsets" % where)
        dt, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if not isinstance(dt, str) or dt not in _NP:
            raise CaseError("%s: dtype %r is not one this reader takes" % (where, dt))
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_uint(d) for d in shape):
            raise CaseError("%s: shape %r is not a list of at most %d integers >= 0" % (where, shape, MAX_DIMS))
        if not isinstance(offs, list) or len(offs) != 2 or not all(_uint(o) for o in offs) or offs[0] > offs[1]:
            raise CaseError("%s: data_offsets %r is not [begin, end] with 0 <= begin <= end" % (where, offs))
        count = 1
        for d in shape:
            count *= d
        nbytes = count * np.dtype(_NP[dt]).itemsize
        if nbytes >= 2 ** 63 or offs[1] - offs[0] != nbytes:
            raise CaseError("%s: data offsets [%d, %d) do not fit its shape %s" % (where, offs[0], offs[1], shape))
        if offs[1] > data_size:
            raise CaseError("%s: data offsets [%d, %d) run past the %d-byte data section (truncated?)"
                            % (where, offs[0], offs[1], data_size))
        spans.append((offs[0], offs[1], k))
        out[k] = (dt, np.frombuffer(buf, dtype=_NP[dt], count=count, offset=base + offs[0]).reshape(tuple(shape)))
    pos = 0
    for b, e, k in sorted(spans):
        if b != pos:
            raise CaseError("%s: tensor %r at [%d, %d) %s" % (path, k, b, e, "overlaps another" if b < pos else
                                                               "leaves a gap before it (tensors must be contiguous)"))
        pos = e
    if pos != data_size:
        raise CaseError("%s: bytes [%d, %d) of the data section belong to no tensor" % (path, pos, data_size))
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype string, numpy array)} in the dtypes of read_safetensors (BF16 as uint16 bits).
    Written to a temporary name and renamed, so a reader never sees half a file."""
    hdr, blobs, off = {}, [], 0
    if metadata:
        hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, (dt, arr) in tensors.items():
        raw = np.ascontiguousarray(np.asarray(arr).astype(_NP[dt], copy=False)).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(np.asarray(arr).shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- numbers

FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _floats(t):
    """A float tensor of read_safetensors (dtype, raw array) as float32 values."""
    dt, a = t
    if dt == "BF16":
        return from_bf16_bits(a)
    if dt in ("F8_E4M3", "F8_E5M2"):
        return _FP8[dt][a]
    return a.astype(np.float32)


def _fp8_table(exp_bits, man_bits, bias, fn):
    out = np.zeros(256, np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> man_bits) & ((1 << exp_bits) - 1), c & ((1 << man_bits) - 1)
        if fn and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            out[c] = np.nan
        elif not fn and e == (1 << exp_bits) - 1:
            out[c] = s * np.inf if m == 0 else np.nan
        elif e == 0:
            out[c] = s * m * 2.0 ** (1 - bias - man_bits)
        else:
            out[c] = s * (1 + m / 2.0 ** man_bits) * 2.0 ** (e - bias)
    return out


_FP8 = {"F8_E4M3": _fp8_table(4, 3, 7, True), "F8_E5M2": _fp8_table(5, 2, 15, False)}


def _np(a):
    """A numpy array from an array, a list, or a torch tensor (without importing torch)."""
    if a is None:
        return None
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        t = a.detach()
        if str(getattr(t, "dtype", "")).startswith("torch.int") or str(t.dtype) == "torch.long":
            return t.cpu().numpy()
        return t.float().cpu().numpy()
    return np.asarray(a)


def to_bf16_bits(a):
    """float array -> bf16 bits (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def from_bf16_bits(b):
    """bf16 bits (uint16) -> float32 values."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _ordered_mag(bits):
    b = bits.astype(np.int64)
    return (b >> 15) & 1, b & 0x7FFF


class Verdict:
    """The outcome of Case.check: ok, the verdict line (str), the y metrics and the routing figures."""

    def __init__(self, ok, line, metrics, routing=None):
        self.ok, self.line, self.metrics, self.routing = ok, line, metrics, routing

    def __str__(self):
        return self.line

    def __bool__(self):
        return self.ok


def compare(a_bits, b_bits, rule="outside", terms=None):
    """SPEC.md section 7 metrics of bf16 arrays a (candidate) and b (reference) and the verdict of a rule
    of docs/scenarios.md ("outside", "outside-fp8-mma", "exact-quant" or "fp8-mma"); terms: the reference's
    y_terms (float32, same size), the S of the outside rules' bound (None: S = 0). Returns (ok, why, metrics
    dict); metrics["beyond_terms"] counts the elements beyond with S, metrics["tol_violations"] without."""
    a_bits = np.asarray(a_bits, dtype=np.uint16).ravel()
    b_bits = np.asarray(b_bits, dtype=np.uint16).ravel()
    if rule not in RULES:
        raise ValueError("rule %r is not one of %s" % (rule, ", ".join(RULES)))
    x = from_bf16_bits(a_bits).astype(np.float64)
    y = from_bf16_bits(b_bits).astype(np.float64)
    fy, fx = np.isfinite(y), np.isfinite(x)
    m = {"n": int(x.size)}
    m["ref_nonfinite"] = int((~fy).sum())
    m["ref_nonfinite_bad"] = int((~fy & (np.isnan(y) | (x != y))).sum())
    m["bad_nonfinite"] = int((fy & ~fx).sum())
    both = fy & fx
    xa, ya = x[both], y[both]
    sab, saa, sbb = float((xa * ya).sum()), float((xa * xa).sum()), float((ya * ya).sum())
    m["rms_ref"] = float(np.sqrt(sbb / xa.size)) if xa.size else 0.0
    d = np.abs(xa - ya)
    m["max_abs"] = float(d.max()) if d.size else 0.0
    m["deepgemm_diff"] = 1.0 - 2.0 * sab / (saa + sbb) if saa + sbb > 0 else 0.0
    m["tol_violations"] = int((d > ATOL + RTOL * np.abs(ya)).sum())
    s = np.zeros_like(ya) if terms is None else \
        np.asarray(terms, dtype=np.float32).ravel()[both].astype(np.float64)
    m["beyond_terms"] = int((d > ATOL + RTOL * np.abs(ya) + TERMS_SCALE * s).sum())
    na, ma = _ordered_mag(a_bits[both])
    nb, mb = _ordered_mag(b_bits[both])
    ulp = np.minimum(np.where(na == nb, np.abs(ma - mb), ma + mb), 65535)
    for q, key in ((0.50, "ulp_p50"), (0.99, "ulp_p99")):
        m[key] = int(np.sort(ulp)[max(0, int(np.ceil(q * ulp.size)) - 1)]) if ulp.size else 0
    m["ulp_max"] = int(ulp.max()) if ulp.size else 0
    if m["bad_nonfinite"] or m["ref_nonfinite_bad"]:
        return False, ("%d NaN or Inf values where the reference is finite, %d non-finite reference values not "
                       "repeated as the same infinity" % (m["bad_nonfinite"], m["ref_nonfinite_bad"])), m
    if m["n"] == 0:
        return True, "", m
    bound, share, rmsf, with_terms = RULES[rule]
    allowed = max(1, int(share * m["n"]))
    beyond = m["beyond_terms"] if with_terms else m["tol_violations"]
    worst = ATOL + rmsf * m["rms_ref"] if rmsf is not None else float("inf")
    ok = m["deepgemm_diff"] < bound and beyond <= allowed and m["max_abs"] <= worst
    if ok:
        why = ""
    elif with_terms:
        why = ("%s tolerance broken: diff %.3g (must be < %g), %d beyond with S (at most %d; %d without)"
               % (rule, m["deepgemm_diff"], bound, beyond, allowed, m["tol_violations"]))
    else:
        why = ("%s tolerance broken: diff %.3g (must be < %g), %d beyond atol/rtol (at most %d), max |a-b| %.3g "
               "(at most %.3g)" % (rule, m["deepgemm_diff"], bound, beyond, allowed, m["max_abs"], worst))
    return ok, why, m


def _kept(ids, w, E, sentinel):
    """A row's kept experts as a sorted list of (id, weight), the count of malformed entries and of
    pruned or padding slots with a non-zero weight."""
    kept, bad, nz = [], 0, 0
    for j, i in enumerate(ids):
        i = int(i)
        wt = float(w[j]) if w is not None else 0.0
        if 0 <= i < E:
            kept.append((i, wt))
        elif sentinel == "absent" or (sentinel == "E" and i == E) or (sentinel == "-1" and i == -1):
            nz += not abs(wt) <= WEIGHT_ATOL
        else:
            bad += 1
    return sorted(kept), bad, nz


def compare_routing(ids, weights, ref_ids, ref_weights, E, sentinel="E", rtol=WEIGHT_RTOL):
    """Routing of a candidate against the reference (sentinel E), the weights within WEIGHT_ATOL + rtol |b|
    (WEIGHT_RTOL_BF16 for an engine at bf16_ops). Returns (ok, why, summary)."""
    if not (WEIGHT_RTOL <= rtol < 1):
        raise CaseError("the weights' rtol must be in [1e-5, 1), not %r" % (rtol,))
    ids = np.asarray(ids).astype(np.int64)
    ref_ids = np.asarray(ref_ids).astype(np.int64)
    if ids.ndim != 2 or ids.shape[0] != ref_ids.shape[0]:
        raise CaseError("topk_ids has shape %s; the case needs [%d, k]" % (ids.shape, ref_ids.shape[0]))
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != ids.shape:
            raise CaseError("topk_weights has shape %s, topk_ids %s" % (weights.shape, ids.shape))
    ref_weights = np.asarray(ref_weights, dtype=np.float64)
    bad_tokens, malformed, wbad, wn, first, firstw = 0, 0, 0, 0, "", ""
    for t in range(ids.shape[0]):
        a, ma, nza = _kept(ids[t], weights[t] if weights is not None else None, E, sentinel)
        b, mb, _ = _kept(ref_ids[t], ref_weights[t], E, "E")
        malformed += ma + mb
        if ma or mb or [i for i, _ in a] != [i for i, _ in b]:
            bad_tokens += 1
            if not first:
                first = "token %d: experts {%s} vs the reference's {%s}%s" % (
                    t, ",".join(str(i) for i, _ in a), ",".join(str(i) for i, _ in b),
                    " (malformed ids for sentinel %s)" % sentinel if ma else "")
            continue
        if weights is None:
            continue
        wbad += nza
        for (i, wa), (_, wb) in zip(a, b):
            wn += 1
            if not (np.isfinite(wa) and np.isfinite(wb) and abs(wa - wb) <= WEIGHT_ATOL + rtol * abs(wb)):
                wbad += 1
                if not firstw:
                    firstw = "token %d expert %d: weight %.9g vs the reference's %.9g" % (t, i, wa, wb)
    summary = "tokens %d id sets differ %d malformed %d" % (ids.shape[0], bad_tokens, malformed)
    if weights is not None:
        summary += " weights %d beyond %d" % (wn, wbad)
    if bad_tokens or malformed:
        return False, "topk_ids differ as sets on %d tokens; first: %s" % (bad_tokens, first), summary
    if wbad:
        return False, "topk_weights: %d beyond |a-b| <= %g + %g |b|; first: %s" % (
            wbad, WEIGHT_ATOL, rtol, firstw or "a pruned slot with a non-zero weight"), summary
    return True, "", summary


# --------------------------------------------------------------------------- cases

class Case:
    """One exported case folder. Tensors load lazily."""

    def __init__(self, folder):
        self.dir = folder
        path = os.path.join(folder, "case.json")
        try:
            st = os.stat(path)
            if not _stat.S_ISREG(st.st_mode):
                raise CaseError("%s: not a regular file" % path)
            if st.st_size > MAX_CASE_JSON:
                raise CaseError("%s: %d bytes, over the limit of %d" % (path, st.st_size, MAX_CASE_JSON))
            with open(path, "rb") as f:
                self.meta = json.loads(f.read(MAX_CASE_JSON + 1).decode("utf-8"), object_pairs_hook=_no_duplicates)
        except CaseError:
            raise
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
            raise CaseError("%s: %s" % (path, e)) from None
        m = self.meta
        if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("version"), int):
            raise CaseError("%s: not a %s folder" % (path, FORMAT))
        if m["version"] not in (2, FORMAT_VERSION):
            raise CaseError("%s: version %d; this helper reads versions 2 and %d (version 2 added each rounding "
                            "profile's expected file with y_terms, SPEC.md section 10: export the cases again)"
                            % (path, m["version"], FORMAT_VERSION))
        pad = m.get("padded")
        if pad is not None and (m["version"] < 3 or not isinstance(pad, dict) or not _uint(pad.get("bucket"))
                                or not _uint(m.get("tokens")) or pad["bucket"] <= m["tokens"]):
            raise CaseError('%s: "padded" must be {"bucket": B, ...} with B above "tokens" (version 3 on)' % path)
        files = m.get("files")
        by = files.get("expected_by_rounding") if isinstance(files, dict) else None
        if not isinstance(by, dict) or "spec" not in by or any(
                k not in ROUNDINGS or not _plain_name(v) for k, v in by.items()):
            raise CaseError("%s: files.expected_by_rounding must map rounding profiles (spec, bf16_ops, fp32; spec "
                            "at least) to file names in the case folder" % path)
        for key in ("model", "input"):
            if not _plain_name(files.get(key)):
                raise CaseError("%s: files.%s must be a file name in the case folder" % (path, key))
        if not isinstance(m.get("case"), str) or not m["case"]:
            raise CaseError("%s: no \"case\" id" % path)
        if not isinstance(m.get("config"), dict) or not all(
                isinstance(v, (int, float, str, bool)) for v in m["config"].values()):
            raise CaseError("%s: needs a \"config\" object of numbers, booleans and strings" % path)
        for key in ("layer", "tokens"):
            if not _uint(m.get(key)) or m[key] >= 2 ** 31:
                raise CaseError("%s: \"%s\" must be an integer >= 0" % (path, key))
        if not _uint(m["config"].get("dim")) or not _uint(m["config"].get("n_routed_experts")):
            raise CaseError("%s: config needs dim and n_routed_experts" % path)
        self.roundings = dict(by)
        self.id = m["case"]
        self.name = m.get("name", self.id) if isinstance(m.get("name"), str) else self.id
        self.title = m.get("title") if isinstance(m.get("title"), str) else self.name
        self.config = dict(m["config"])
        self.layer = m["layer"]
        self.tokens = m["tokens"]
        self.bucket = pad["bucket"] if pad is not None else None  # a padded case's rows (docs/engines.md)
        self.layout = m.get("layout", "split")
        self.model_path = os.path.join(folder, files["model"])
        self._input = None
        self._expected = {}

    def __repr__(self):
        return "Case(%r)" % self.id

    def config_strings(self):
        """The config as `key=value` strings of SPEC.md section 8 (true/false for booleans)."""
        out = {}
        for k, v in self.config.items():
            out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out

    def _load_input(self):
        if self._input is None:
            path = os.path.join(self.dir, self.meta["files"]["input"])
            t = read_safetensors(path)
            H = int(self.config["dim"])
            if "x" not in t or t["x"][0] != "BF16" or t["x"][1].shape != (self.tokens, H) or \
                    "input_ids" not in t or t["input_ids"][0] != "I32" or t["input_ids"][1].shape != (self.tokens,):
                raise CaseError("%s: not the x BF16 [%d, %d] and input_ids I32 [%d] of the case"
                                % (path, self.tokens, H, self.tokens))
            B = self.bucket
            if B is not None and ("x_padded" not in t or t["x_padded"][0] != "BF16" or t["x_padded"][1].shape != (B, H)
                                  or "input_ids_padded" not in t or t["input_ids_padded"][0] != "I32"
                                  or t["input_ids_padded"][1].shape != (B,)):
                raise CaseError("%s: a padded case needs x_padded BF16 [%d, %d] and input_ids_padded I32 [%d]"
                                % (path, B, H, B))
            self._input = t
        return self._input

    @property
    def x_bits(self):
        """x as bf16 bits (uint16) [T, H]."""
        return self._load_input()["x"][1]

    @property
    def x(self):
        """x as float32 (bf16 values) [T, H]."""
        return from_bf16_bits(self.x_bits)

    @property
    def input_ids(self):
        return self._load_input()["input_ids"][1]

    @property
    def x_padded(self):
        """A padded case's input in its bucket, float32 [bucket, H]: x, then NaN rows (None when not padded)."""
        return None if self.bucket is None else from_bf16_bits(self._load_input()["x_padded"][1])

    @property
    def input_ids_padded(self):
        """A padded case's input ids in its bucket [bucket]: input_ids, then vocab_size and -1 alternating."""
        return None if self.bucket is None else self._load_input()["input_ids_padded"][1]

    @property
    def expected(self):
        """The spec profile's expected_at("spec")."""
        return self.expected_at("spec")

    def expected_at(self, rounding):
        """The reference at a rounding profile: {"y": float32 [T, H], "y_bits": uint16, "topk_ids": int32 [T, K]
        (E pruned), "topk_weights": float32, "y_terms": float32 [T, H]}. CaseError when the case was not
        exported with that profile or its file does not fit the case."""
        if rounding not in ROUNDINGS:
            raise CaseError("%s: '%s' is not a rounding profile (spec, bf16_ops, fp32)" % (self.id, rounding))
        if rounding not in self.roundings:
            raise CaseError("%s: the case was exported without rounding %s (it has: %s); export with --rounding "
                            "naming it" % (self.id, rounding, " ".join(r for r in ROUNDINGS if r in self.roundings)))
        if rounding not in self._expected:
            path = os.path.join(self.dir, self.roundings[rounding])
            t = read_safetensors(path)
            T, H = self.tokens, int(self.config["dim"])
            if "y" not in t or t["y"][0] != "BF16" or t["y"][1].shape != (T, H) or "topk_ids" not in t \
                    or "topk_weights" not in t:
                raise CaseError("%s: not the y BF16 [%d, %d], topk_ids and topk_weights of the case" % (path, T, H))
            if "y_terms" not in t or t["y_terms"][0] != "F32" or t["y_terms"][1].shape != (T, H):
                raise CaseError("%s: y_terms must be F32 [%d, %d] (SPEC.md section 10.2); found %s" % (
                    path, T, H, "%s %s" % (t["y_terms"][0], list(t["y_terms"][1].shape)) if "y_terms" in t
                    else "absent"))
            yv, terms = from_bf16_bits(t["y"][1]), t["y_terms"][1]
            bad = ~(terms >= 0) & np.isfinite(yv)
            if bad.any():
                i, j = np.argwhere(bad)[0]
                raise CaseError("%s: y_terms[%d, %d] is %g where y is finite; a term bound is >= 0"
                                % (path, i, j, terms[i, j]))
            self._expected[rounding] = {"y_bits": t["y"][1], "y": yv, "topk_ids": t["topk_ids"][1],
                                        "topk_weights": t["topk_weights"][1], "y_terms": terms}
        return self._expected[rounding]

    def weights(self):
        """The layer's checkpoint {key: (dtype, array)} (BF16 and F8 as raw bits)."""
        return read_safetensors(self.model_path)

    def check(self, y, topk_ids=None, topk_weights=None, sentinel="E", fp8=False, raise_on_failure=True,
              rounding="spec", declared=False, peak_workspace_bytes=None):
        """Holds an engine's output against the reference at the engine's rounding profile (SPEC.md section
        10: "spec", "bf16_ops" or "fp32"). y: [T, H] (bf16 bits as uint16, or any float array/tensor, rounded
        to bf16). Returns the Verdict; raises CheckFailed when it fails (unless raise_on_failure is False) and
        CaseError when the output does not fit the case or the case has no such profile. `declared` only
        words the verdict (the profile came from the output's engine_rounding). peak_workspace_bytes, the
        engine's peak workspace for the case, is held to the case's memory bound as check does: over its
        factor times memory.workspace_bound_bytes fails."""
        T, H = self.tokens, int(self.config["dim"])
        exp = self.expected_at(rounding)
        ya = _np(y)
        if self.bucket is not None:  # an output of the whole bucket: the tokens' rows are judged
            cut = lambda a: a[:T] if a is not None and a.ndim == 2 and a.shape[0] == self.bucket else a
            ya, topk_ids, topk_weights = cut(ya), cut(_np(topk_ids)), cut(_np(topk_weights))
        if ya is None or ya.ndim != 2 or ya.shape != (T, H):
            raise CaseError("%s: y has shape %s; the case needs [%d, %d]"
                            % (self.id, None if ya is None else ya.shape, T, H))
        bits = ya if ya.dtype == np.uint16 else to_bf16_bits(ya)
        rule = "outside-fp8-mma" if fp8 else "outside"
        ok, why, m = compare(bits, exp["y_bits"], rule, exp["y_terms"])
        line = ("y beyond %d with S, %d without; n %d max_abs %.4g diff %.3g ulp p50/p99/max %d/%d/%d "
                "bad_nonfinite %d" % (m["beyond_terms"], m["tol_violations"], m["n"], m["max_abs"],
                                      m["deepgemm_diff"], m["ulp_p50"], m["ulp_p99"], m["ulp_max"],
                                      m["bad_nonfinite"]))
        rok, rwhy, rsum = True, "", "routing not given"
        if topk_weights is not None and topk_ids is None:
            raise CaseError("%s: topk_weights without topk_ids (weights are matched by expert id)" % self.id)
        if topk_ids is not None:
            rok, rwhy, rsum = compare_routing(_np(topk_ids), _np(topk_weights), exp["topk_ids"],
                                              exp["topk_weights"], int(self.config["n_routed_experts"]), sentinel,
                                              WEIGHT_RTOL_BF16 if rounding == "bf16_ops" else WEIGHT_RTOL)
        verdict = "%s %s (rule %s, rounding %s%s): %s; routing: %s" % (
            "pass" if ok and rok else "FAIL", self.id, rule, rounding,
            " from the output's engine_rounding" if declared else "", line, rsum)
        mok, mline = self._memory(peak_workspace_bytes)
        verdict = verdict.replace("pass ", "FAIL ", 1) if not mok and verdict.startswith("pass ") else verdict
        if not (ok and rok):
            verdict += "; " + "; ".join(w for w in (why, rwhy) if w)
        if mline:
            verdict += "; " + mline
        v = Verdict(ok and rok and mok, verdict, m, rsum)
        if not v.ok and raise_on_failure:
            raise CheckFailed(verdict)
        return v

    def _memory(self, peak):
        """(ok, line) of the memory verdict: ok and "" without a report or without the case's bound."""
        mem = self.meta.get("memory")
        if peak is None or not isinstance(mem, dict) or mem.get("workspace_bound_bytes") is None:
            return True, ""
        bound, factor = mem["workspace_bound_bytes"], mem.get("factor", 2.0)
        if not _uint(bound) or isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor <= 1e6:
            raise CaseError("%s: \"memory\" must be {\"workspace_bound_bytes\": an integer >= 0 or null, "
                            "\"factor\": a number in [1, 1e6]}" % self.id)
        if not _uint(peak):
            raise CaseError("%s: peak_workspace_bytes %r is not a byte count" % (self.id, peak))
        ok = peak <= factor * bound
        return ok, "memory: peak workspace %d bytes, %.2fx the contract's bound %d bytes; %s %gx" % (
            peak, peak / bound if bound else float("inf") if peak else 0.0, bound, "within" if ok else "over", factor)

    def write_output(self, outputs_dir, y, topk_ids=None, topk_weights=None, engine=None, rounding=None,
                     peak_workspace_bytes=None):
        """Writes outputs_dir/<id>/output.safetensors for `dsv4moe check` (y as bf16 unless it is float32);
        rounding (a profile name) is recorded as the metadata engine_rounding, which check honours, and
        peak_workspace_bytes (the engine's peak workspace for the case) as the metadata of that name."""
        if rounding is not None and rounding not in ROUNDINGS:
            raise ValueError("rounding %r is not one of %s" % (rounding, ", ".join(ROUNDINGS)))
        folder = os.path.join(outputs_dir, self.id)
        os.makedirs(folder, exist_ok=True)
        ya = _np(y)
        t = {"y": ("BF16", ya) if ya.dtype == np.uint16 else ("F32", ya.astype(np.float32))}
        if topk_ids is not None:
            t["topk_ids"] = ("I32", _np(topk_ids).astype(np.int32))
        if topk_weights is not None:
            t["topk_weights"] = ("F32", _np(topk_weights).astype(np.float32))
        meta = {}
        if engine:
            meta["engine"] = engine
        if rounding:
            meta["engine_rounding"] = rounding
        if peak_workspace_bytes is not None:
            if not _uint(peak_workspace_bytes):
                raise ValueError("peak_workspace_bytes %r is not a byte count" % (peak_workspace_bytes,))
            meta["peak_workspace_bytes"] = str(int(peak_workspace_bytes))
        write_safetensors(os.path.join(folder, "output.safetensors"), t, meta or None)


MANIFEST = "manifest.json"
MAX_MANIFEST = 64 << 20


def _crc32(path):
    """(bytes, crc32) of a regular file, not following a link (compare/manifest.c's CRC-32 is zlib's)."""
    import zlib
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise CaseError("%s: cannot open: %s" % (path, e.strerror)) from None
    with os.fdopen(fd, "rb") as f:
        if not _stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CaseError("%s: not a regular file" % path)
        crc, n = 0, 0
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return n, crc
            crc, n = zlib.crc32(chunk, crc), n + len(chunk)


def verify_manifest(folder, ids):
    """The export's manifest (docs/engines.md) against the case folders `ids` of `folder`, as `dsv4moe check`
    holds it: present, well-formed, listing exactly these folders, every listed file of its size and
    CRC-32 (the model: its size). CaseError naming what is missing, extra or different."""
    path = os.path.join(folder, MANIFEST)
    try:
        st = os.lstat(path)
    except OSError:
        raise CaseError("%s: no manifest: not a complete export (an export writes it last, and one that stopped "
                        "part-way leaves none); export the cases again" % path) from None
    if not _stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST:
        raise CaseError("%s: not a regular file of at most %d bytes" % (path, MAX_MANIFEST))
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read().decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CaseError("%s: %s" % (path, e)) from None
    if not isinstance(m, dict) or m.get("format") != "dsv4moe-engine-export" or m.get("version") != 1 or \
            not isinstance(m.get("cases"), dict):
        raise CaseError("%s: not a dsv4moe-engine-export manifest of version 1 with an object \"cases\"" % path)
    for i in ids:
        if i not in m["cases"]:
            raise CaseError("%s: case folder '%s' is not in the manifest (added after the export?)" % (path, i))
    for cid, files in m["cases"].items():
        if cid not in ids:
            raise CaseError("%s: case '%s' of the manifest is missing from %s" % (path, cid, folder))
        if not isinstance(files, dict):
            raise CaseError("%s: case '%s': not an object of files" % (path, cid))
        for name, f in files.items():
            if not _plain_name(name) or not isinstance(f, dict) or not _uint(f.get("bytes")) or \
                    ("crc32" in f and not isinstance(f["crc32"], str)):
                raise CaseError("%s: case '%s': entry '%s' is not a file name with bytes" % (path, cid, name))
            fp = os.path.join(folder, cid, name)
            if "crc32" in f:
                size, crc = _crc32(fp)
                ok = size == f["bytes"] and "%08x" % crc == f["crc32"]
            else:
                try:
                    size = os.lstat(fp).st_size
                except OSError as e:
                    raise CaseError("%s: cannot stat: %s" % (fp, e.strerror)) from None
                ok = size == f["bytes"]
            if not ok:
                raise CaseError("%s: differs from the export's manifest: altered since the export" % fp)


def cases(folder, where=None):
    """The case folders of an export (sorted by id) as Case objects; `where(case)` filters. The export's
    manifest is verified first (verify_manifest), as `dsv4moe check` does."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise CaseError("%s: %s" % (folder, e.strerror)) from None
    ids = []
    for n in names:
        try:
            st = os.lstat(os.path.join(folder, n, "case.json"))
        except OSError:
            continue
        if not n.startswith(".") and _stat.S_ISREG(st.st_mode):
            ids.append(n)
    if not ids:
        raise CaseError("%s: no case folder (dsv4moe export writes them)" % folder)
    verify_manifest(folder, ids)
    out = []
    for n in ids:
        c = Case(os.path.join(folder, n))
        if where is None or where(c):
            out.append(c)
    return out


def _main(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="python3 -m dsv4moe.testing",
                                 description="check an engine's outputs against exported cases")
    ap.add_argument("cases")
    ap.add_argument("--outputs", required=True)
    ap.add_argument("--sentinel", default="E", choices=["E", "-1", "absent"])
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--rounding", default="spec", choices=ROUNDINGS,
                    help="the engine's rounding profile where an output has no engine_rounding metadata")
    a = ap.parse_args(argv)
    worst = 0
    try:
        allc = cases(a.cases)
    except CaseError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    for c in allc:
        path = os.path.join(a.outputs, c.id, "output.safetensors")
        try:
            if not os.path.exists(path):
                raise CaseError("no output: %s does not exist (a case without an output is an error)" % path)
            t = read_safetensors(path)
            if "y" not in t:
                raise CaseError("%s has no tensor y" % path)
            if t["y"][0] not in FLOATS or ("topk_weights" in t and t["topk_weights"][0] not in FLOATS):
                raise CaseError("%s: y and topk_weights must be float tensors (%s)" % (path, ", ".join(FLOATS)))
            if "topk_ids" in t and t["topk_ids"][0] not in ("I32", "I64"):
                raise CaseError("%s: topk_ids must be I32 or I64" % path)
            y = t["y"][1] if t["y"][0] == "BF16" else _floats(t["y"])
            ids = t["topk_ids"][1] if "topk_ids" in t else None
            w = _floats(t["topk_weights"]) if "topk_weights" in t else None
            declared = t.get("__metadata__", (None, {}))[1].get("engine_rounding")
            if declared is not None and declared not in ROUNDINGS:
                raise CaseError("%s: metadata engine_rounding '%s' is not a rounding profile (spec, bf16_ops, fp32)"
                                % (path, declared))
            pw = t.get("__metadata__", (None, {}))[1].get("peak_workspace_bytes")
            if pw is not None and (not pw.isdigit() or not pw.isascii() or len(pw) > 19):
                raise CaseError("%s: metadata peak_workspace_bytes '%s' is not a decimal byte count" % (path, pw[:40]))
            v = c.check(y, ids, w, sentinel=a.sentinel, fp8=a.fp8, raise_on_failure=False,
                        rounding=declared or a.rounding, declared=declared is not None,
                        peak_workspace_bytes=None if pw is None else int(pw))
        except (CaseError, ValueError, TypeError, KeyError, IndexError, OSError) as e:  # bad input: exit 2
            print("ERROR %s: %s" % (c.id, e))
            worst = 2
            continue
        print(v.line)
        worst = max(worst, 0 if v.ok else 1)
    return worst


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
