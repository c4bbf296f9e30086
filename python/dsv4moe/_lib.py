"""The shared library through ctypes (include/dsv4moe/*.h). Internal: dsv4moe.Layer is the API.

The library is found, in order, at ``$DSV4MOE_LIB`` (a file), under ``$DSV4MOE_BUILD`` (a build
folder), in the package's own ``_native/`` (where ``pip install ./python`` puts the library it
builds), in the repository's ``build/cuda/`` then ``build/`` when the package runs from a checkout,
and by the system's loader (an installed ``libdsv4moe.so.0``). Nothing is loaded until a Layer is
made, so ``import dsv4moe`` and ``dsv4moe.testing`` work without the library.

The versioned structs the calls take are mirrored here; each mirror is checked against the
``struct_size`` the library's own init function writes, so a library of another layout is refused
with a message instead of being misread.
"""

import ctypes
import ctypes.util
import os

c_i64 = ctypes.c_int64
c_u64 = ctypes.c_uint64
c_u32 = ctypes.c_uint32
c_int = ctypes.c_int
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p

MAX_BUCKETS = 16
CONFIG_BYTES = 4096  # an opaque buffer for dsv4_config (the library fills it; checked below)
STATUS = {0: "ok", 1: "invalid argument", 2: "config", 3: "io", 4: "format", 5: "shape", 6: "range",
          7: "nomem", 8: "not found", 9: "unsupported", 10: "refused", 11: "numeric", 12: "device",
          13: "comm", 14: "internal"}
BACKENDS = {"ref": 0, "cpu": 1, "cuda": 2}


class Error(RuntimeError):
    """A library call failed: ``status`` (the dsv4_status code), ``where`` and the message."""

    def __init__(self, status, where, message):
        super().__init__(message or STATUS.get(status, str(status)))
        self.status = status
        self.where = where


class DsvError(ctypes.Structure):
    _fields_ = [("status", c_int), ("where", ctypes.c_char * 256), ("message", ctypes.c_char * 1024)]


class Topology(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("world_size", c_int), ("tp", c_int), ("dp", c_int), ("ep", c_int),
                ("rank", c_int), ("role", c_int), ("backend", c_int), ("sm", c_int), ("cuda_graph", ctypes.c_bool),
                ("n_buckets", c_int), ("buckets", c_i64 * MAX_BUCKETS), ("max_tokens_per_rank", c_i64),
                ("chunk_tokens", c_i64), ("host_threads", c_int), ("dispatch", c_int), ("executor", c_int)]


class Budget(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("device_bytes", c_u64), ("reserve_mb", c_u64), ("taken_bytes", c_u64)]


class Options(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("threads", c_int), ("workspace", c_void_p), ("workspace_bytes", c_u64),
                ("params", ctypes.c_char_p)]


class ForwardOut(ctypes.Structure):
    _fields_ = [("y", c_void_p), ("topk_ids", c_void_p), ("topk_weights", c_void_p), ("kept_counts", c_void_p)]


class DeviceErrors(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("bad_input_ids", c_u64), ("first_bad_input", c_i64),
                ("nonfinite_rows", c_u64), ("bad_expert_ids", c_u64)]


_SIGS = {
    "dsv4_config_init": (None, [c_void_p]),
    "dsv4_config_preset": (c_int, [c_char_p, c_void_p, c_void_p]),
    "dsv4_config_set": (c_int, [c_void_p, c_char_p, c_char_p, c_void_p]),
    "dsv4_config_get": (c_int, [c_void_p, c_char_p, c_char_p, ctypes.c_size_t, c_void_p]),
    "dsv4_config_load_file": (c_int, [c_void_p, c_char_p, c_void_p]),
    "dsv4_config_validate": (c_int, [c_void_p, c_void_p]),
    "dsv4_config_is_hash_layer": (ctypes.c_bool, [c_void_p]),
    "dsv4_topology_init": (None, [c_void_p]),
    "dsv4_budget_init": (None, [c_void_p]),
    "dsv4_plan_create": (c_int, [c_void_p, c_void_p, c_void_p, ctypes.POINTER(c_void_p), c_void_p]),
    "dsv4_plan_free": (None, [c_void_p]),
    "dsv4_checkpoint_open": (c_int, [c_char_p, ctypes.POINTER(c_void_p), c_void_p]),
    "dsv4_checkpoint_close": (None, [c_void_p]),
    "dsv4_backend_options_init": (None, [c_void_p]),
    "dsv4_backend_create_with": (c_int, [c_void_p, c_void_p, c_void_p, ctypes.POINTER(c_void_p), c_void_p]),
    "dsv4_backend_free": (None, [c_void_p]),
    "dsv4_backend_name": (c_char_p, [c_void_p]),
    "dsv4_backend_forward": (c_int, [c_void_p, c_i64, c_void_p, c_void_p, c_void_p, c_void_p]),
    "dsv4_backend_forward_device": (c_int, [c_void_p, c_i64, c_void_p, c_void_p, c_void_p, c_void_p]),
    "dsv4_backend_enqueue": (c_int, [c_void_p, c_void_p, c_i64, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "dsv4_backend_poll_error": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "dsv4_backend_workspace_size": (c_int, [c_void_p, c_i64, ctypes.POINTER(c_u64), c_void_p]),
    "dsv4_backends_available": (c_char_p, []),
}

_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("DSV4MOE_LIB")
    if env:
        return [env]
    out = []
    build = os.environ.get("DSV4MOE_BUILD")
    if build:
        out += [os.path.join(build, "cuda", "libdsv4moe.so"), os.path.join(build, "libdsv4moe.so")]
    here = os.path.dirname(os.path.abspath(__file__))
    out += [os.path.join(here, "_native", "libdsv4moe.so.0")]
    root = os.path.dirname(os.path.dirname(here))
    out += [os.path.join(root, "build", "cuda", "libdsv4moe.so"), os.path.join(root, "build", "libdsv4moe.so")]
    found = ctypes.util.find_library("dsv4moe")
    out += [found] if found else []
    out += ["libdsv4moe.so.0"]
    return out


def lib():
    """The loaded library (loaded on first use); Error naming where it looked otherwise."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (res, args) in _SIGS.items():
            fn = getattr(handle, name)
            fn.restype = res
            fn.argtypes = args
        _check_layouts(handle, path)
        _lib, _lib_path = handle, path
        return handle
    raise Error(9, "dsv4moe library", "libdsv4moe.so not found: set DSV4MOE_LIB to the file or DSV4MOE_BUILD "
                "to a build folder (make; make cuda for the cuda backend); tried " + "; ".join(tried))


def lib_path():
    lib()
    return _lib_path


def _check_layouts(handle, path):
    for cls, init in ((Topology, handle.dsv4_topology_init), (Budget, handle.dsv4_budget_init),
                      (Options, handle.dsv4_backend_options_init)):
        s = cls()
        init(ctypes.byref(s))
        if s.struct_size != ctypes.sizeof(cls):
            raise Error(9, path, "%s: the library's struct is %d bytes, this package's mirror %d: a library of "
                        "another version" % (cls.__name__, s.struct_size, ctypes.sizeof(cls)))


def check(status, err):
    """Raises Error for a non-zero status with the library's message."""
    if status:
        raise Error(status, err.where.decode(errors="replace"), err.message.decode(errors="replace"))
