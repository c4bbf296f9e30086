#!/usr/bin/env python3
"""An independent safetensors reader (standard library only), used by the tests to
check that files written by dsv4moe are readable by something that is not dsv4moe.

usage: st_check.py FILE [--expect NAME:DTYPE:D0,D1,...]...
Prints one line per tensor; exits 1 when the file is malformed or an expectation fails.
"""
import json
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2,
         "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


def main(argv):
    path, expects = argv[1], []
    i = 2
    while i < len(argv):
        if argv[i] == "--expect":
            expects.append(argv[i + 1])
            i += 2
        else:
            raise SystemExit("unknown argument " + argv[i])
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data_len = len(blob) - 8 - n
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    spans = []
    for name, t in tensors.items():
        numel = 1
        for d in t["shape"]:
            numel *= d
        begin, end = t["data_offsets"]
        if end - begin != numel * SIZES[t["dtype"]]:
            print(f"{name}: size mismatch", file=sys.stderr)
            return 1
        spans.append((begin, end))
        print(f"{name} {t['dtype']} {t['shape']}")
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            print("gap or overlap in data", file=sys.stderr)
            return 1
        pos = e
    if pos != data_len:
        print(f"data section is {data_len} bytes, tensors cover {pos}", file=sys.stderr)
        return 1
    for ex in expects:
        name, dtype, shape = ex.split(":")
        want = [int(s) for s in shape.split(",")] if shape else []
        t = tensors.get(name)
        if t is None or t["dtype"] != dtype or t["shape"] != want:
            print(f"expectation failed: {ex}, found {t}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
