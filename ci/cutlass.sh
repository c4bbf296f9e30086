#!/bin/sh
# Puts the CUTLASS C++ headers (the pinned PyPI wheel nvidia-cutlass, docs/dependencies.md) under
# DEST (default build/cutlass-4.2.0.0): DEST/include/cutlass, DEST/include/cute. Used by `make cuda`.
# The wheel is fetched with pip (no Python is needed at run time: only its headers are used) and
# checked against its sha256 before anything is unpacked. Where a copy is already there (the GPU
# machine gets one carried in .cutlass/, it has no network) nothing is fetched.
set -eu
VER=4.2.0.0
SHA=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
DEST=${1:-build/cutlass-$VER}
[ -f "$DEST/include/cutlass/util/packed_stride.hpp" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
PY=${PYTHON:-python3}
if ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "cutlass: pip is missing (Debian: apt-get install python3-pip)" >&2
    exit 1
fi
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$VER" >&2
whl=$(ls "$tmp"/nvidia_cutlass-$VER-*.whl)
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$SHA" ]; then
    echo "cutlass: $whl has sha256 $got, expected $SHA: refused" >&2
    exit 1
fi
mkdir -p "$tmp/x"
(cd "$tmp/x" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall()' "$whl")
mkdir -p "$DEST.part"
rm -rf "$DEST.part/include"
mv "$tmp/x/cutlass_library/source/include" "$DEST.part/include"
# the header-only utilities (packed strides) live beside the library's headers in the wheel
cp -r "$tmp/x/cutlass_library/source/tools/util/include/cutlass/util" "$DEST.part/include/cutlass/util"
rm -rf "$DEST"
mv "$DEST.part" "$DEST"
echo "cutlass: headers $VER under $DEST/include" >&2
