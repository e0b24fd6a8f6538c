"""The GPU machine's exactness and end-to-end checks, on any device.

bench/gpu.sh runs them on ``--device cuda`` (with the machine's python3, nothing
installed); the test suite runs them on ``--device cpu`` (``--smoke``), so that a rename
in the code they call cannot break them unseen before they first run on a GPU:

1. for each of five algorithms, the simulator's batched gradients (``batch_workers=8``)
   against the sequential ones: the same events, parameters within 1e-10 (float64);
   for the first, also replayed as a CUDA graph (``--cuda-graph``);
2. ``dana train --device DEVICE --batch-workers auto`` on synthetic data, one epoch;
3. ``--pack auto``'s measure: one run's peak memory and the pack size it gives (on the
   CPU: that the measure is refused, the CPU's size being 1);
4. a push waits for nothing: ``dana train``'s simulator (the small BatchNorm CNN), after
   warm-up steps, runs its next steps under CUDA's sync debug mode ``error`` (a host
   synchronisation raises), sync-free and with ``--cuda-graph``; each run's records
   equal a synced run's: the same events, losses within 1e-4 (bit for bit on the CPU,
   where the debug mode does not exist).

Each check prints ``PASS`` or ``FAIL`` and a figure; the last line is ``checks passed
P of N``, and the exit status is 1 when one failed.

Run: ``python bench/gpu_checks.py --device cuda`` (bench/gpu.sh), ``--device cpu
--smoke`` (the suite: fewer algorithms, seconds).
"""

from __future__ import annotations

import argparse
import functools
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


def batched_equals_sequential(algorithm: str, device: str, cuda_graph: bool = False) -> bool:
    seq = simulate(algorithm, device)
    bat = simulate(algorithm, device, batch_workers=8, cuda_graph=cuda_graph)
    same = seq.log.numpy()["worker"].tolist() == bat.log.numpy()["worker"].tolist()
    diff = (seq.params() - bat.params()).abs().max().item()
    ok = same and diff <= 1e-10 and seq.params().device.type == device
    print(
        f"{'PASS' if ok else 'FAIL'} {device} batched{' --cuda-graph' * cuda_graph} == "
        f"sequential, {algorithm}: same events {same}, max |diff| {diff:.2e}"
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


def _records(device: str, sync_free: bool, cuda_graph: bool) -> dict:
    """The log of 80 steps of ``dana train``'s simulator, the last 60 of them under the
    sync debug mode ``error`` on a GPU."""
    import dana.sim.driver as driver
    from dana.train.task.problem import Problem

    config = TrainConfig(
        dataset="synthetic", model="cnn", train_size=1024, test_size=128, batch_size=32,
        workers=8, device=device, cuda_graph=cuda_graph,
    ).validate()  # fmt: skip
    build = driver.Simulator
    driver.Simulator = functools.partial(build, sync_free=sync_free)
    try:
        sim = driver.build_simulator(config, Problem(config))
    finally:
        driver.Simulator = build
    sim.run(pushes=20)
    watch = device == "cuda" and sync_free
    if watch:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        sim.run(pushes=80)
    finally:
        if watch:
            torch.cuda.set_sync_debug_mode("default")
    return sim.log.numpy()


def no_sync_per_push(device: str) -> bool:
    synced = _records(device, False, False)
    ok = True
    for name, graph in (("sync-free", False), ("--cuda-graph", True)):
        try:
            log = _records(device, True, graph)
        except RuntimeError as e:  # (the debug mode's error: a push waited)
            print(f"FAIL {device} {name}: a push synchronises ({str(e).splitlines()[0]})")
            ok = False
            continue
        same = all(log[c].tolist() == synced[c].tolist() for c in ("worker", "staleness"))
        diff = float(abs(log["loss"] - synced["loss"]).max())
        good = same and diff <= (1e-4 if device == "cuda" else 0.0)
        print(
            f"{'PASS' if good else 'FAIL'} {device} {name}: 60 steps "
            + ("without a host synchronisation" if device == "cuda" else "(no debug mode)")
            + f"; same events {same}, max |loss diff| {diff:.1e} against a synced run"
        )
        ok = ok and good
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
    results.append(batched_equals_sequential(ALGORITHMS[0], args.device, cuda_graph=True))
    results.append(train_end_to_end(args.device))
    results.append(pack_auto(args.device))
    results.append(no_sync_per_push(args.device))
    print(f"checks passed {sum(results)} of {len(results)}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
