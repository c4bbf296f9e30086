"""The build of ``pip install ./python`` from a checkout: the C library and the ``dsv4moe`` CLI are
built with the project's own Makefile (``make -C .. all``; incremental, so a tree already built is
not rebuilt) and installed inside the package, ``dsv4moe/_native/`` (the library is found there by
dsv4moe._lib, the CLI is the console script ``dsv4moe``). The metadata is in pyproject.toml.

Before running make it checks the build's Debian packages and, when one is missing, stops with the
one ``apt-get install`` line that fixes it. ``DSV4MOE_SKIP_NATIVE=1`` installs the Python files alone
(the library then comes from $DSV4MOE_LIB, $DSV4MOE_BUILD or the system); ``DSV4MOE_BUILD_DIR``
(default ``build``) is the Makefile's BUILD folder; ``CC`` is the compiler of both.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VERSION = "0.1.0"  # the Makefile's VERSION: the library file is libdsv4moe.so.VERSION

# (Debian package, C code that needs it, extra link flags): what the Makefile's library and CLI need
PROBES = [
    ("libjansson-dev", "#include <jansson.h>\nint main(void) { return json_object() == 0; }\n", ["-ljansson"]),
    ("libyaml-dev", "#include <yaml.h>\nint main(void) { yaml_parser_t p; return !yaml_parser_initialize(&p); }\n",
     ["-lyaml"]),
    ("libopenblas-dev", "#include <cblas.h>\nint main(void) { float a = 1; cblas_sscal(1, 2, &a, 1); return 0; }\n",
     ["-lopenblas"]),
]


def fail(msg):
    sys.stderr.write("\ndsv4moe: %s\n\n" % msg)
    raise SystemExit(1)


def missing_packages(cc):
    """The Debian packages the build lacks (build-essential: no C compiler or make)."""
    if not shutil.which(shlex.split(cc)[0]) or not shutil.which("make"):
        return ["build-essential"] + [p for p, _, _ in PROBES]
    out = []
    with tempfile.TemporaryDirectory() as d:
        for pkg, code, libs in PROBES:
            src = os.path.join(d, "probe.c")
            with open(src, "w") as f:
                f.write(code)
            r = subprocess.run(shlex.split(cc) + [src, "-o", os.path.join(d, "probe")] + libs,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode:
                out.append(pkg)
    return out


def build_native():
    """make the library and the CLI; returns their paths."""
    if not (os.path.isfile(os.path.join(ROOT, "Makefile")) and os.path.isdir(os.path.join(ROOT, "core"))):
        fail("the C sources are not beside this folder (%s has no Makefile): install from a checkout of the "
             "repository (pip install ./python), or set DSV4MOE_SKIP_NATIVE=1 for the Python files alone" % ROOT)
    cc = os.environ.get("CC", "cc")
    missing = missing_packages(cc)
    if missing:
        fail("building the C library needs Debian packages that are missing (%s). Install them with:\n"
             "    sudo apt-get install -y %s" % (", ".join(missing), " ".join(missing)))
    build = os.environ.get("DSV4MOE_BUILD_DIR", "build")
    cmd = ["make", "-C", ROOT, "-j%d" % (os.cpu_count() or 1), "BUILD=" + build, "CC=" + cc, "all"]
    sys.stderr.write("dsv4moe: %s\n" % " ".join(cmd))
    if subprocess.run(cmd).returncode:
        fail("the build failed: %s (its output is above)" % " ".join(cmd))
    base = build if os.path.isabs(build) else os.path.join(ROOT, build)
    return os.path.join(base, "libdsv4moe.so." + VERSION), os.path.join(base, "dsv4moe")


class BuildPyNative(build_py):
    def run(self):
        super().run()
        if os.environ.get("DSV4MOE_SKIP_NATIVE") == "1":
            return
        lib, cli = build_native()
        dst = os.path.join(self.build_lib, "dsv4moe", "_native")
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(lib, os.path.join(dst, "libdsv4moe.so.0"))
        shutil.copy2(cli, os.path.join(dst, "dsv4moe"))


class NativeDistribution(Distribution):
    """A wheel with the native files is for this platform, not pure Python."""

    def has_ext_modules(self):
        return os.environ.get("DSV4MOE_SKIP_NATIVE") != "1"


setup(cmdclass={"build_py": BuildPyNative}, distclass=NativeDistribution)
