#!/usr/bin/env python3
"""Each kernel's machine code size (sm_90a SASS bytes) in the CUDA translation units given.

A latency-bound kernel that runs once per step on one multiprocessor (the decode step's router)
waits on instruction fetch from L2 for every code line of its path, so its code size is a measure
of its time that needs no GPU (docs/cuda.md, "The block that routes"). Compiles each file with
nvcc -cubin as `make cuda` compiles it and reads the ELF section table of the cubin: a kernel's
code is the section .text.<mangled name>. Needs nvcc only (no cuobjdump).

  python3 ci/code-size.py [--filter SUBSTRING] fast/cuda/router_count.cu [more .cu ...]

Prints one line per kernel: bytes, instructions (16 bytes each), the demangled name (c++filt where
present). Exit 2 on a bad argument or a failed compile.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def sections(path):
    """(name, size) of every section of the ELF64 file at path."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = heads[shstrndx][4]
    out = []
    for h in heads:
        start = stroff + h[0]
        name = data[start:data.index(b"\0", start)].decode()
        out.append((name, h[5]))
    return out


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    got = r.stdout.splitlines()
    return got if r.returncode == 0 and len(got) == len(names) else names


def main(argv):
    filt = None
    files = []
    i = 0
    while i < len(argv):
        if argv[i] == "--filter" and i + 1 < len(argv):
            filt = argv[i + 1]
            i += 2
            continue
        if argv[i].startswith("-") or not argv[i].endswith(".cu"):
            print(f"code-size: {argv[i]}: expected .cu files (and --filter SUBSTRING)", file=sys.stderr)
            return 2
        files.append(argv[i])
        i += 1
    if not files:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: code-size.py [--filter SUBSTRING] FILE.cu ...", file=sys.stderr)
        return 2
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    with tempfile.TemporaryDirectory() as tmp:
        for src in files:
            cubin = os.path.join(tmp, os.path.basename(src) + ".cubin")
            cmd = [nvcc, "-std=c++17", "-O3", "-I.", "-Iinclude", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                   "-o", cubin, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"code-size: {src}: nvcc failed:\n{r.stderr}", file=sys.stderr)
                return 2
            text = [(n[len(".text."):], s) for n, s in sections(cubin) if n.startswith(".text.")]
            names = demangle([n for n, _ in text])
            print(f"== {src}")
            for (mangled, size), name in zip(text, names):
                if filt and filt not in name:
                    continue
                print(f"{size:8d} bytes {size // 16:6d} instructions  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
