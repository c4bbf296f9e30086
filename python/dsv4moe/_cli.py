"""The ``dsv4moe`` console script of an installed package: runs the CLI that ``pip install ./python``
built into ``dsv4moe/_native/`` (python/setup.py) with the same arguments and exit status."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", "dsv4moe")
    if not os.access(exe, os.X_OK):
        sys.stderr.write("dsv4moe: this installation has no CLI (%s is absent: installed with "
                         "DSV4MOE_SKIP_NATIVE=1?); install from a checkout with pip install ./python\n" % exe)
        return 2
    os.execv(exe, [exe] + sys.argv[1:])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
