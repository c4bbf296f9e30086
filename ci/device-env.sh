# Sourced on the device machine (Ubuntu, no network, no libyaml/jansson/Check/OpenBLAS headers):
# unpacks the Debian packages carried in .debs/ (fetched here with `apt-get download`, see
# docs/dependencies.md) into a private prefix, never into /, and points the compiler, the
# linker and the loader at it. Also keeps NVLink multicast off, as the device docs require.
DSV4_PFX=${DSV4_DEVICE_PREFIX:-/tmp/dsv4-pfx}
if [ ! -d "$DSV4_PFX/usr" ]; then
    mkdir -p "$DSV4_PFX"
    for f in .debs/*.deb; do dpkg -x "$f" "$DSV4_PFX" || return 1; done
fi
_a=x86_64-linux-gnu
_inc="$DSV4_PFX/usr/include:$DSV4_PFX/usr/include/$_a:$DSV4_PFX/usr/include/$_a/openblas-pthread"
_lib="$DSV4_PFX/usr/lib/$_a:$DSV4_PFX/usr/lib/$_a/openblas-pthread"
export CPATH="$_inc${CPATH:+:$CPATH}"
export LIBRARY_PATH="$_lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$DSV4_PFX/usr/lib/$_a/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
export DSV4_NO_DEPS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset _a _inc _lib
# The CUTLASS headers of `make cuda` (ci/cutlass.sh): the machine has no network, so they travel in
# the git-ignored .cutlass/ (a copy of build/cutlass-4.2.0.0 made here).
if [ -f .cutlass/include/cutlass/util/packed_stride.hpp ]; then
    export CUTLASS_DIR=.cutlass
fi
