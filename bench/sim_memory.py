"""How much memory does each simulated worker cost?

Simulates ``k`` in {1, 16, 64} workers of a ResNet-20-sized flat parameter vector
(d = 272,474, float32) with ``dana-zero`` and ``dana-slim`` (``gamma`` timing, gap
measured), each run in a fresh Python subprocess, and reads the subprocess's peak
resident memory (``VmHWM`` in ``/proc/self/status``; ``ru_maxrss`` where that is
missing) after ``--pushes`` pushes. The gradient is a cheap synthetic quadratic,
``grad = p - c`` into one reused buffer, so that what grows with ``k`` is the
simulator's own state: the parameters each worker computes at, and the per-worker
momenta (at the master for ``dana-zero``, in the workers for ``dana-slim``). Each
worker pushes several times, so every row of every ``(k, d)`` tensor has been written
(a freshly zeroed tensor takes no resident memory until it is touched).

The last line is the larger over the two algorithms of
(peak at k = 64 - peak at k = 1) / (63 * d):

    bytes per worker-parameter 8.1

(two float32 ``(k, d)`` tensors make 8).

Run: ``python bench/sim_memory.py`` (under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from common import parse_with_smoke

ROOT = Path(__file__).resolve().parents[1]
D = 272_474  # ResNet-20


def peak_rss_bytes() -> int:
    """This process's peak resident set size, in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, else KiB


def child(algorithm: str, k: int, d: int, pushes: int) -> None:
    """Run one simulation and print its peak memory as JSON (in the subprocess)."""
    sys.path.insert(0, str(ROOT))
    import torch

    import dana.algorithms as A
    from dana.sim import Simulator
    from dana.train.task.batches import BatchStream

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(d, generator=gen)
    grad = torch.empty(d)

    def gradient(params, batch):  # 0.5 * |p - c|^2: the gradient is p - c
        torch.sub(params, target, out=grad)
        return grad, 0.5 * float(grad.dot(grad))

    sim = Simulator(
        A.build(algorithm, momentum=0.9),
        torch.randn(d, generator=gen),
        gradient,
        BatchStream(50_000, 128, seed=0),
        k,
        lr=0.01,
        timing="gamma",
        seed=0,
    )
    sim.run(pushes=pushes)
    pushed = len(set(sim.log.numpy()["worker"].tolist()))
    print(json.dumps({"peak": peak_rss_bytes(), "workers_pushed": pushed}))


def measure(algorithm: str, k: int, d: int, pushes: int) -> dict:
    cmd = [sys.executable, __file__, "--child", algorithm, str(k), str(d), str(pushes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{algorithm} k={k} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        algorithm, k, d, pushes = sys.argv[2], *map(int, sys.argv[3:6])
        child(algorithm, k, d, pushes)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--algorithms", nargs="+", default=["dana-zero", "dana-slim"])
    parser.add_argument("--d", type=int, default=D, help="parameters (default ResNet-20's)")
    parser.add_argument("--pushes", type=int, default=1000, help="pushes per run")
    args = parse_with_smoke(parser)
    if args.smoke:
        args.workers, args.d, args.pushes = [1, 4], 100_000, 40
    ks = sorted(set(args.workers))
    if len(ks) < 2:
        parser.error("give at least two worker counts")
    lo, hi = ks[0], ks[-1]

    print(
        f"d = {args.d:,} float32, gamma timing, {args.pushes} pushes, one fresh "
        "subprocess per run; peak RSS in MiB"
    )
    header = (
        f"{'algorithm':<10} {'k':>3} {'peak MiB':>9} {'+MiB vs k=' + str(lo):>12} {'B/(w*p)':>8}"
    )
    print(header)
    print("-" * len(header))
    per_param = {}
    for name in args.algorithms:
        base = None
        for k in ks:
            r = measure(name, k, args.d, args.pushes)
            if r["workers_pushed"] != k:
                raise RuntimeError(f"{name} k={k}: only {r['workers_pushed']} workers pushed")
            peak = r["peak"]
            if base is None:
                base = peak
            extra = peak - base
            b = extra / ((k - lo) * args.d) if k > lo else None
            shown = f"{b:>8.2f}" if b is not None else f"{'-':>8}"
            print(f"{name:<10} {k:>3} {peak / 2**20:>9.1f} {extra / 2**20:>12.1f} {shown}")
            if k == hi:
                per_param[name] = b
    worst = max(per_param, key=per_param.get)
    print(f"(last line: (peak at k={hi} - peak at k={lo}) / ({hi - lo} * d), {worst}, the larger)")
    print(f"bytes per worker-parameter {per_param[worst]:.1f}")


if __name__ == "__main__":
    main()
