"""dsv4moe: Python over the dsv4moe library (docs/embedding.md, docs/engines.md).

``dsv4moe.Layer`` runs one MoE layer on a backend of the shared library (ctypes; NumPy arrays, and
torch tensors through the custom op ``torch.ops.dsv4moe.moe``); ``dsv4moe.hf.patch`` puts it in
place of HF transformers' DeepseekV4SparseMoeBlock; ``dsv4moe.testing`` verifies an engine against
exported cases. Importing the package loads neither the library nor torch; the library is loaded
when the first Layer is made (dsv4moe._lib says where it is looked for).
"""

import sys

__all__ = ["Layer", "Error", "testing", "hf"]


def __getattr__(name):
    if name == "Layer":
        from .layer import Layer
        return Layer
    if name == "Error":
        from ._lib import Error
        return Error
    if name in ("testing", "hf", "torch_ops"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'dsv4moe' has no attribute %r" % name)


if "torch" in sys.modules:  # the op is registered where torch is already in use; else on first torch input
    try:
        from . import torch_ops as _ops
        _ops.register()
    except Exception:  # an old torch without torch.library.custom_op: Layer's torch path raises then
        pass
