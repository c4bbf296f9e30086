#!/usr/bin/env python3
"""A server step in PyTorch around one MoE layer (docs/embedding.md): the layer between torch ops
(an RMSNorm before it, the residual add after it) captured once per token bucket in a CUDA graph,
replayed per step, its error word polled when the server looks.

    usage: embed.py PRESET LAYER WEIGHTS     (needs torch with CUDA and build/cuda/libdsv4moe.so,
                                              or DSV4MOE_LIB naming the library)
"""
import sys

import torch

import dsv4moe


def main(preset, layer, weights):
    moe = dsv4moe.Layer({"preset": preset, "layer": int(layer)}, weights, backend="cuda", threads=8,
                        max_tokens=256)
    H = moe.dim
    norm_w = torch.ones(H, dtype=torch.bfloat16, device="cuda")

    def step(x, ids):
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * norm_w
        y, topk_ids, topk_w = moe(h, ids)  # torch.ops.dsv4moe.moe on the current stream
        return x + y

    graphs = {}
    for T in (1, 32, 256):  # one graph per bucket, static buffers of the bucket's size
        x = torch.zeros(T, H, dtype=torch.bfloat16, device="cuda")
        ids = torch.zeros(T, dtype=torch.int32, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step(x, ids)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step(x, ids)
        graphs[T] = (g, x, ids, out)

    for n in (1, 20, 200):
        T = min(b for b in graphs if b >= n)
        g, x, ids, out = graphs[T]
        x.zero_()
        x[:n] = torch.randn(n, H, device="cuda").to(torch.bfloat16)
        g.replay()
        moe.poll_error(torch.cuda.current_stream())  # raises dsv4moe.Error for a latched bad input
        print("embed.py: %d tokens in bucket %d: |out| %.4f" % (n, T, out[:n].float().abs().mean().item()))
    print("embed.py: served 3 steps")
    moe.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: embed.py PRESET LAYER WEIGHTS")
    main(*sys.argv[1:])
