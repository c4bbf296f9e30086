"""The torch custom op ``torch.ops.dsv4moe.moe(handle, x, input_ids, valid_tokens) -> (y, ids, w)``.

Registered by ``register()`` (dsv4moe.Layer calls it on its first torch input; importing dsv4moe
calls it when torch is already imported). The real implementation enqueues the layer on the
current torch stream with the tensors' device pointers (dsv4_backend_enqueue): no copy, no host
synchronisation, so torch.cuda.graph captures it between other ops; host tensors run the host
forward through NumPy views. The fake implementation gives torch.compile the output shapes.
"""

import threading

_DONE = False
_LOCK = threading.Lock()


def _forward(handle, x, input_ids, valid_tokens):
    import numpy as np
    import torch

    from .layer import layer_of, tensor_to_numpy
    layer = layer_of(handle)
    if x.dim() != 2 or x.shape[1] != layer.dim:
        raise ValueError("x has shape %s; the layer takes [T, %d]" % (tuple(x.shape), layer.dim))
    T, K = x.shape[0], layer.n_activated
    if x.is_cuda:
        if layer.backend != "cuda":
            raise ValueError("a CUDA tensor needs backend 'cuda' (this layer runs %s)" % layer.backend)
        if x.dtype != torch.bfloat16:
            raise TypeError("x must be bfloat16 on the device (got %s)" % x.dtype)
        x = x.contiguous()
        ids_ptr = None
        if input_ids is not None:
            input_ids = input_ids.to(device=x.device, dtype=torch.int32).contiguous()
            ids_ptr = input_ids.data_ptr()
        vt_ptr = None
        if valid_tokens is not None:
            valid_tokens = valid_tokens.to(device=x.device, dtype=torch.int32).contiguous()
            vt_ptr = valid_tokens.data_ptr()
        y = torch.empty((T, layer.dim), dtype=torch.bfloat16, device=x.device)
        tk = torch.empty((T, K), dtype=torch.int32, device=x.device)
        tw = torch.empty((T, K), dtype=torch.float32, device=x.device)
        if T:  # T = 0: nothing to enqueue (the library asks for a y pointer, an empty tensor has none)
            stream = torch.cuda.current_stream(x.device).cuda_stream
            layer.enqueue(stream, T, x.data_ptr(), ids_ptr, y.data_ptr(), tk.data_ptr(), tw.data_ptr(), vt_ptr)
        return y, tk, tw
    if valid_tokens is not None:
        raise ValueError("valid_tokens is for device tensors")
    _, xa = tensor_to_numpy(x.to(torch.bfloat16))
    ids = None if input_ids is None else input_ids.detach().cpu().numpy().astype(np.int32)
    y, tk, tw = layer.forward_numpy(xa, ids)
    return (torch.from_numpy(y.view(np.int16)).view(torch.bfloat16), torch.from_numpy(tk), torch.from_numpy(tw))


def register():
    """Registers torch.ops.dsv4moe.moe once (needs torch >= 2.4 for torch.library.custom_op)."""
    global _DONE
    with _LOCK:
        if _DONE:
            return
        import typing

        import torch

        @torch.library.custom_op("dsv4moe::moe", mutates_args=())
        def moe(handle: int, x: torch.Tensor, input_ids: typing.Optional[torch.Tensor],
                valid_tokens: typing.Optional[torch.Tensor]) -> typing.Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return _forward(handle, x, input_ids, valid_tokens)

        @moe.register_fake
        def _(handle, x, input_ids, valid_tokens):
            from .layer import layer_of
            K = layer_of(handle).n_activated
            T = x.shape[0]
            return (x.new_empty((T, x.shape[1]), dtype=torch.bfloat16), x.new_empty((T, K), dtype=torch.int32),
                    x.new_empty((T, K), dtype=torch.float32))

        _DONE = True
