"""Copy/compute overlap on one GPU: a pinned host->device copy on a side CUDA stream while
a matmul runs on the default stream. Part of the prepared device check
(scripts/device_check.sh); never run by CI or ``make test``.

    python scripts/device_overlap.py [--mib 512] [--n 8192] [--repeats 5] [--out FILE]

Times the copy alone, the matmuls alone, and both issued together (copy on a side stream,
matmuls on the default one), each the median of ``--repeats`` after one warm-up, with CUDA
events. ``overlap`` is the share of the shorter operation hidden by the concurrent run:
``(copy + compute - both) / min(copy, compute)`` (1.0: fully hidden, 0.0: serialised).
Prints one JSON object (and writes it to ``--out``). Without CUDA it prints a "no CUDA"
note in the same JSON shape and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any


def _median_ms(fn: Any, repeats: int) -> float:
    import torch

    fn()  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(mib: int, n: int, repeats: int) -> dict[str, Any]:
    """The copy, compute and overlapped timings on ``cuda:0`` (see the module docstring)."""
    import torch

    out: dict[str, Any] = {"check": "device_overlap", "torch": torch.__version__,
                           "cuda_available": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        out.update(ran=False, note="no CUDA: torch.cuda.is_available() is False; the "
                   "copy/compute overlap was not measured")
        return out
    dev = torch.device("cuda:0")
    host = torch.empty(mib * 2**20 // 4, dtype=torch.float32).pin_memory()
    target = torch.empty(host.shape, dtype=torch.float32, device=dev)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    side = torch.cuda.Stream(device=dev)

    def copy() -> None:
        with torch.cuda.stream(side):
            target.copy_(host, non_blocking=True)
        torch.cuda.current_stream(dev).wait_stream(side)

    def compute() -> None:
        for _ in range(4):
            torch.mm(a, b)

    def both() -> None:
        with torch.cuda.stream(side):
            target.copy_(host, non_blocking=True)
        compute()
        torch.cuda.current_stream(dev).wait_stream(side)

    copy_ms = _median_ms(copy, repeats)
    compute_ms = _median_ms(compute, repeats)
    both_ms = _median_ms(both, repeats)
    hidden = copy_ms + compute_ms - both_ms
    out.update(ran=True, device=torch.cuda.get_device_name(dev), copy_mib=mib, matmul_n=n,
               copy_ms=copy_ms, copy_gib_s=mib / 1024 / (copy_ms / 1e3),
               compute_ms=compute_ms, both_ms=both_ms,
               overlap=max(0.0, hidden) / min(copy_ms, compute_ms))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="device_overlap.py")
    p.add_argument("--mib", type=int, default=512, help="pinned host buffer copied (MiB)")
    p.add_argument("--n", type=int, default=8192, help="matmul size (n x n, float32)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.mib <= 0 or args.n <= 0 or args.repeats <= 0:
        p.error(f"--mib, --n and --repeats must be > 0, got {args.mib}, {args.n}, "
                f"{args.repeats}")
    result = measure(args.mib, args.n, args.repeats)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
