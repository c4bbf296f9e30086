"""What the peer scripts of ci/device-check.sh share (bench/torch_peer.py, hf_peer.py,
scaled_gmm_peer.py): the command line, the repetitions per T, CUDA-graph capture, the JSON written
whole or not at all, error text, and the exit status. torch is passed in, never imported here, so a
script can still say "no torch" in its JSON."""
import json
import os
import sys
import traceback

TOKENS = [1, 8, 32, 128, 256, 1024, 4096, 16384]


def add_common_args(ap, default_json):
    ap.add_argument("--json", default=default_json)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--preset", default="v4-flash", choices=["v4-flash", "mini"])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-graph", action="store_true")


def tokens(args):
    return [int(t) for t in args.tokens.split(",") if t]


def reps_for(T, quick):
    """Timed calls per T: 50 up to T = 256, then 30, 20 and 10 (--quick: a fifth, at least 5)."""
    reps = 50 if T <= 256 else 30 if T <= 1024 else 20 if T <= 4096 else 10
    return max(5, reps // 5) if quick else reps


def err(ex):
    return f"{type(ex).__name__}: {str(ex).splitlines()[0][:300] if str(ex) else ''}"


def write_json(path, obj):
    """Written to a temporary name and renamed: a reader sees the whole file or none."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def capture(torch, fn):
    """fn captured in a CUDA graph after two warm-up calls on a side stream (the allocator and the
    libraries' lazy set-up happen outside the capture); returns the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def run(main):
    """sys.exit(main()); an exception escaping main is printed and exits 1."""
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
