#!/usr/bin/env python3
"""Reruns, each in a process of its own, the scenario cases that failed after a device fault.

A kernel that faults (an illegal address, a launch failure) leaves an error on the CUDA context
that every later CUDA call of the process returns, so in one `dsv4moe run` every case after the
faulting one fails as well, and the report cannot say whether they would pass. This reads the
report of such a run, finds the first case whose failure is one of those errors and reruns every
case that failed from there on alone (`--filter` with its name, a report of its own), then prints
each one's verdict in the whole run and alone.

usage: scen-isolate.py REPORT_DIR SECONDS CMD...
  REPORT_DIR  the --report folder of the run (its report.json)
  SECONDS     the time for all the reruns; a case is not started with less than 20 s left
  CMD         the run's command line without --report and --filter (e.g. build/cuda/dsv4moe run
              scenarios/gpu.yaml --backend cuda --cache DIR)

exit 0: no case failed with such an error, or no case rerun alone failed; 1: some case failed
alone (each is named), or the time ran out before every case was rerun; 2: bad input.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

# cudaGetErrorString's texts of the errors that stay on the context (the sticky ones)
STICKY = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "invalid program counter",
    "hardware stack error",
    "operation not supported on global/shared address space",
    "launch timed out and was terminated",
    "uncorrectable ECC error",
)


def sticky(case):
    text = json.dumps(case)
    return next((s for s in STICKY if s in text), None)


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    rdir, cmd = argv[1], argv[3:]
    try:
        budget = float(argv[2])
    except ValueError:
        print("scen-isolate: SECONDS: not a number: %r" % argv[2], file=sys.stderr)
        return 2
    path = os.path.join(rdir, "report.json")
    try:
        with open(path) as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError) as e:
        print("scen-isolate: %s: cannot read the run's cases: %s" % (path, e), file=sys.stderr)
        return 2
    first = next((i for i, c in enumerate(cases) if c.get("status") == "fail" and sticky(c)), None)
    if first is None:
        print("scen-isolate: no case failed with an error that stays on the CUDA context; nothing to rerun")
        return 0
    print("scen-isolate: first device fault in case %s (%s); rerunning each case that failed from there on alone"
          % (cases[first]["name"], sticky(cases[first])))
    todo = [c["name"] for c in cases[first:] if c.get("status") == "fail"]
    end = time.monotonic() + budget
    failed, left = [], []
    for name in todo:
        rest = end - time.monotonic()
        if rest < 20:
            left.append(name)
            continue
        with tempfile.TemporaryDirectory(prefix="scen-iso-") as out:
            try:
                subprocess.run(cmd + ["--filter", name, "--report", out], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=rest, check=False)
            except subprocess.TimeoutExpired:
                left.append(name)
                continue
            except OSError as e:
                print("scen-isolate: cannot run %s: %s" % (cmd[0], e), file=sys.stderr)
                return 2
            try:
                with open(os.path.join(out, "report.json")) as f:
                    mine = [c for c in json.load(f)["cases"] if c.get("name") == name]
            except (OSError, ValueError, KeyError):
                mine = []
        alone = mine[0].get("status", "?") if mine else "no report"
        why = sticky(mine[0]) if mine else None
        print("  %-60s whole run: fail   alone: %s%s" % (name, alone, " (%s)" % why if why else ""))
        if alone in ("fail", "no report"):
            failed.append(name)
    print("scen-isolate: %d rerun, %d failed alone%s" % (len(todo) - len(left), len(failed),
                                                         ", %d not rerun (time)" % len(left) if left else ""))
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
