#!/usr/bin/env python3
"""Records a real PyTorch NCCL flight-recorder dump (a world of one rank, one GPU) and holds it,
and divergent copies of it, against each other with `dsv4moe symmetry` (docs/engines.md).

usage: record_flight_recorder.py OUT_DIR [--cli build/dsv4moe]

Writes OUT_DIR/nccl_trace_rank_0.json: the JSON of torch._C._distributed_c10d._dump_nccl_trace_json()
after an all_reduce, an all_gather, an all_to_all and a barrier on an NCCL process group (the flight
recorder is on through TORCH_NCCL_TRACE_BUFFER_SIZE). Then, as the other ranks of a pretend world:
  nccl_trace_rank_1.json  an identical copy           -> symmetry must say "the same" (exit 0)
  nccl_trace_rank_2.json  the second collective's sequence number moved on (a rank that skipped one)
  nccl_trace_rank_3.json  the first collective's input size changed (a rank with another count)
                                                      -> each must diverge (exit 1) naming both ranks
Exit status 0 when all three verdicts are as expected; 2 without torch, CUDA or NCCL.
"""
import json
import os
import subprocess
import sys

# The flight recorder reads these when the process group is created: set them before torch starts.
os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the name newer torch reads
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def record(path):
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("record: no CUDA device or no NCCL in this torch")
        return False
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)
    g = torch.ones(1024, 4096, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(g)
    dist.all_gather_into_tensor(out, g)
    a2a = torch.ones(64, 4096, dtype=torch.bfloat16, device=dev)
    dist.all_to_all_single(torch.empty_like(a2a), a2a)
    dist.barrier()
    torch.cuda.synchronize()
    text, how = None, []
    # the symbol has moved between torch versions: the NCCL dump first, on the C module or the
    # Python one, then the generic flight recorder's
    import torch.distributed.distributed_c10d as dc
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        for mod in (torch._C._distributed_c10d, dc):
            fn = getattr(mod, name, None)
            for args in ((True, False), ()):
                if fn is None or text is not None:
                    continue
                try:
                    text = fn(*args)
                    how.append("%s.%s%s" % (mod.__name__, name, args))
                except Exception as e:  # noqa: BLE001 - try the next spelling
                    how.append("%s.%s%s failed: %r" % (mod.__name__, name, args, e))
    print("record: " + "; ".join(how))
    dist.destroy_process_group()
    if text is None:
        return False
    with open(path, "w") as f:
        f.write(text if isinstance(text, str) else text.decode("utf-8"))
    return True


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    cli = sys.argv[sys.argv.index("--cli") + 1] if "--cli" in sys.argv else os.path.join("build", "dsv4moe")
    cli = os.path.abspath(cli)  # torch's rank processes may run elsewhere
    os.makedirs(out, exist_ok=True)
    p0 = os.path.join(out, "nccl_trace_rank_0.json")
    try:
        if not record(p0):
            return 2
    except Exception as e:  # no torch, or NCCL would not start
        print("record: %r" % (e,))
        return 2
    with open(p0) as f:
        d = json.load(f)
    coll = [e for e in d.get("entries", []) if not e.get("is_p2p")]
    print("recorded %d entries (%d collectives): %s" % (len(d.get("entries", [])), len(coll),
                                                        [e.get("profiling_name") for e in coll]))
    if len(coll) < 2:
        print("record: the dump holds fewer than two collectives")
        return 1
    with open(os.path.join(out, "nccl_trace_rank_1.json"), "w") as f:
        json.dump(d, f)
    d2 = json.loads(json.dumps(d))
    [e for e in d2["entries"] if not e.get("is_p2p")][1]["collective_seq_id"] += 1
    with open(os.path.join(out, "nccl_trace_rank_2.json"), "w") as f:
        json.dump(d2, f)
    d3 = json.loads(json.dumps(d))
    first = [e for e in d3["entries"] if not e.get("is_p2p")][0]
    first["input_sizes"] = [[s * 2 for s in sizes] if i == 0 else sizes for i, sizes in enumerate(first["input_sizes"])]
    with open(os.path.join(out, "nccl_trace_rank_3.json"), "w") as f:
        json.dump(d3, f)
    ok = True
    for other, want in (("1", 0), ("2", 1), ("3", 1)):
        r = subprocess.run([cli, "symmetry", p0, os.path.join(out, "nccl_trace_rank_%s.json" % other)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print("rank 0 vs rank %s: exit %d (want %d)\n%s" % (other, r.returncode, want, r.stdout.strip()))
        ok &= r.returncode == want
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
