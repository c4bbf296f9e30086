#!/usr/bin/env python3
"""Writes the export manifest (docs/engines.md) of a folder of case folders assembled by hand, as
`dsv4moe export` writes it last: for each case folder (holding case.json) every regular file's size
and CRC-32, the model's size only. For tests that build or edit case folders to probe `check`
itself; an export writes its own.

usage: seal_cases.py FOLDER
"""
import json
import os
import sys
import zlib


def main():
    folder = sys.argv[1]
    cases = {}
    for cid in sorted(os.listdir(folder)):
        d = os.path.join(folder, cid)
        if cid.startswith(".") or not os.path.isfile(os.path.join(d, "case.json")):
            continue
        files = {}
        for name in sorted(os.listdir(d)):
            if name.startswith("."):
                continue
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            files[name] = {"bytes": len(data)} if name == "model.safetensors" else \
                {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
        cases[cid] = files
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"format": "dsv4moe-engine-export", "version": 1, "cases": cases}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
