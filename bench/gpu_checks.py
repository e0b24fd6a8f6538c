"""The GPU machine's exactness and end-to-end checks, on any device.

bench/gpu.sh runs them on ``--device cuda`` (with the machine's python3, nothing
installed); the test suite runs them on ``--device cpu`` (``--smoke``), so that a rename
in the code they call cannot break them unseen before they first run on a GPU:

1. for each of five algorithms, the simulator's batched gradients (``batch_workers=8``)
   against the sequential ones: the same events, parameters within 1e-10 (float64);
2. ``dana train --device DEVICE --batch-workers auto`` on synthetic data, one epoch;
3. ``--pack auto``'s measure: one run's peak memory and the pack size it gives (on the
   CPU: that the measure is refused, the CPU's size being 1).

Each check prints ``PASS`` or ``FAIL`` and a figure; the last line is ``checks passed
P of N``, and the exit status is 1 when one failed.

Run: ``python bench/gpu_checks.py --device cuda`` (bench/gpu.sh), ``--device cpu
--smoke`` (the suite: fewer algorithms, seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import dana  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.training import train  # noqa: E402

ALGORITHMS = ["dana-slim", "dana-zero", "nag-asgd", "asgd", "gap-aware"]


def simulate(algorithm: str, device: str, **kw) -> dana.sim.Simulator:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 8, 8, generator=g, dtype=torch.float64)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2)
    ).double()
    result = dana.simulate(
        model, x, y, algorithm=algorithm, workers=8, lr=0.05, epochs=2, batch_size=16,
        dtype="float64", device=device, **kw,
    )  # fmt: skip
    return result.simulator


def batched_equals_sequential(algorithm: str, device: str) -> bool:
    seq, bat = simulate(algorithm, device), simulate(algorithm, device, batch_workers=8)
    same = seq.log.numpy()["worker"].tolist() == bat.log.numpy()["worker"].tolist()
    diff = (seq.params() - bat.params()).abs().max().item()
    ok = same and diff <= 1e-10 and seq.params().device.type == device
    print(
        f"{'PASS' if ok else 'FAIL'} {device} batched == sequential, {algorithm}: "
        f"same events {same}, max |diff| {diff:.2e}"
    )
    return ok


def train_end_to_end(device: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        config = TrainConfig(
            dataset="synthetic", model="cnn", train_size=512, test_size=128, batch_size=32,
            workers=8, epochs=1, device=device, batch_workers="auto",
        )  # fmt: skip
        summary = train(config, Path(tmp) / "run", progress=False)
    ok = summary["pushes"] > 0 and summary["final_test_error"] < 1
    print(
        f"{'PASS' if ok else 'FAIL'} dana train --device {device} --batch-workers auto: "
        f"{summary['pushes']} pushes, test error {summary['final_test_error']:.3f}, "
        f"{time.perf_counter() - start:.1f} s"
    )
    return ok


def pack_auto(device: str) -> bool:
    from dana.sim.pack import auto_pack_size, run_footprint

    config = TrainConfig(
        dataset="synthetic", model="cnn", train_size=512, test_size=128, batch_size=32,
        workers=8, epochs=1, device=device,
    ).validate()  # fmt: skip
    if device != "cuda":
        try:
            run_footprint(config)
        except ValueError as e:
            print(f"PASS {device} --pack auto: no footprint off a GPU ({e})")
            return True
        print(f"FAIL {device} --pack auto: a footprint measured off a GPU")
        return False
    run_bytes = run_footprint(config)
    free, _ = torch.cuda.mem_get_info()
    size = auto_pack_size(run_bytes, free)
    ok = run_bytes > 0 and size >= 2
    print(
        f"{'PASS' if ok else 'FAIL'} cuda --pack auto: one run's peak "
        f"{run_bytes / 2**20:.1f} MiB, {free / 2**30:.1f} GiB free: {size} runs per process"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (bench/gpu.sh) or cpu")
    parser.add_argument("--smoke", action="store_true", help="two algorithms, seconds")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu")
        return 1
    results = [
        batched_equals_sequential(a, args.device)
        for a in (ALGORITHMS[:2] if args.smoke else ALGORITHMS)
    ]
    results.append(train_end_to_end(args.device))
    results.append(pack_auto(args.device))
    print(f"checks passed {sum(results)} of {len(results)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
