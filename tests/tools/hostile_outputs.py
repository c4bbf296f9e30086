#!/usr/bin/env python3
"""Malformed engine outputs for the parity test of `dsv4moe check` and `python3 -m dsv4moe.testing`
(tests/test_engines.c, check_and_helper_agree_on_hostile_outputs): from one valid output file,
writes OUT/<variant>/<case id>/output.safetensors for each variant below; both tools must answer
every one with exit status 2 (bad input), neither passing, hanging nor ending in a traceback.

usage: hostile_outputs.py VALID_OUTPUT CASE_ID OUT
"""
import json
import os
import struct
import sys


def header_and_data(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    return json.loads(buf[8:8 + n]), buf[8 + n:]


def raw(hdr_text, data):
    h = hdr_text.encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def main():
    src, cid, out = sys.argv[1:4]
    hdr, data = header_and_data(src)
    y = hdr["y"]
    variants = {}
    # a duplicate tensor name: the text has "y" twice (json.dumps cannot write it)
    text = json.dumps(hdr)
    variants["duplicate-y"] = raw(text[:-1] + ', "y": ' + json.dumps(y) + "}", data)
    no_off = json.loads(json.dumps(hdr))
    del no_off["y"]["data_offsets"]
    variants["no-data-offsets"] = raw(json.dumps(no_off), data)
    variants["header-list"] = raw(json.dumps([hdr]), data)
    variants["header-length-0"] = struct.pack("<Q", 0) + data
    variants["truncated"] = raw(json.dumps(hdr), data)[:-5]
    overlap = json.loads(json.dumps(hdr))
    names = sorted((k for k in overlap if k != "__metadata__"), key=lambda k: overlap[k]["data_offsets"][0])
    if len(names) > 1:
        b = overlap[names[1]]["data_offsets"]
        overlap[names[1]]["data_offsets"] = [b[0] - 4, b[1] - 4]
    variants["overlap"] = raw(json.dumps(overlap), data)
    gap = json.loads(json.dumps(hdr))
    for k in names:
        gap[k]["data_offsets"] = [o + 8 for o in gap[k]["data_offsets"]]
    variants["gap"] = raw(json.dumps(gap), b"\0" * 8 + data)
    bad_dt = json.loads(json.dumps(hdr))
    bad_dt["y"]["dtype"] = "I16"
    variants["y-integer"] = raw(json.dumps(bad_dt), data)
    if "topk_ids" in hdr and hdr["topk_ids"]["dtype"] == "I32":
        fl = json.loads(json.dumps(hdr))
        fl["topk_ids"]["dtype"] = "F32"
        variants["ids-float"] = raw(json.dumps(fl), data)
    meta = json.loads(json.dumps(hdr))
    meta["__metadata__"] = {"engine": 7}
    variants["metadata-number"] = raw(json.dumps(meta), data)
    neg = json.loads(json.dumps(hdr))
    neg["y"]["shape"] = [-y["shape"][0], y["shape"][1]]
    variants["shape-negative"] = raw(json.dumps(neg), data)
    big = json.loads(json.dumps(hdr))
    big["y"]["shape"] = [2 ** 40, 2 ** 40]
    variants["shape-overflow"] = raw(json.dumps(big), data)
    for name, blob in variants.items():
        d = os.path.join(out, name, cid)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "output.safetensors"), "wb") as f:
            f.write(blob)
    # not regular files: a FIFO (a reader that opens it would hang) and a link to /dev/zero
    for name in ("fifo", "dev-zero"):
        d = os.path.join(out, name, cid)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "output.safetensors")
        if name == "fifo":
            os.mkfifo(p)
        else:
            os.symlink("/dev/zero", p)
        variants[name] = None
    print(" ".join(sorted(variants)))


if __name__ == "__main__":
    main()
