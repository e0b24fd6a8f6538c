"""Does a Ray run on an emulated cluster behave like the simulator on the same cluster?

The same run twice: the simulator on a cluster model (``--cluster``), and the Ray
runtime emulating that model in real time (``--cluster`` with ``--time-scale S``: each
worker sleeps its modelled compute and link times and leaves and returns at the model's
times: :mod:`dana.ps.emulation`). The cluster is heterogeneous and lossy: four workers
of speeds 1, 1, 1/1.5 and 1/2.5 (``worker_factors``; gamma compute times of mean 128
ms), 2 ms latency and 1 Gbit/s per worker link, and one preemption (worker 1 away from
8 s to 14 s of model time: its computation in flight lost, the rule told). Compared:
the staleness (mean, p90), the run's duration in model ms (Ray: training seconds / S)
and the final test error; the errors are Ray minus the simulator. A third run is the
simulator on the cluster model fitted to the Ray run's own ``step_times.csv``
(:func:`dana.train.cluster.fit.fit_cluster`, ``dana fit-cluster``): how close a replay
of a measured cluster comes, the Ray run's overheads (its real calls) included.

Run (from the repository root): ``python bench/ray_vs_sim.py`` (3 seeds, about 4
minutes each on 2 shared cores; ``--seeds 0``), ``--smoke`` for a tiny run that checks
the script. The last line is the mean absolute error of the mean staleness over the
seeds, relative to the simulator's:

    staleness mean error P%
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dana.train.backends import runner_class
from dana.train.cluster.fit import fit_cluster
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress
from dana.train.records.rundir import RunDir
from dana.train.task.problem import Problem

CLUSTER: dict[str, Any] = {
    "name": "hetero-lossy",
    "description": "four workers of speeds 1, 1, 1/1.5, 1/2.5; worker 1 preempted 8-14 s",
    "compute": {"model": "gamma", "worker_factors": [1, 1, 1.5, 2.5]},
    "network": {"latency_ms": 2, "bandwidth_gbps": 1},
    "availability": {"preemptions": [{"worker": 1, "leave_ms": 8000, "rejoin_ms": 14000}]},
}
COMMON: dict[str, Any] = dict(
    algorithm="dana-slim",
    workers=4,
    dataset="synthetic",
    model="mlp",
    train_size=2048,
    test_size=1000,
    epochs=5,
    batch_size=32,
    lr=0.02,
    warmup_epochs=1,
    cluster=CLUSTER,
)


def execute(path: Path, config: TrainConfig) -> tuple[dict[str, Any], np.ndarray]:
    """Run ``config`` into ``path``: its summary and every push's staleness."""
    if path.exists():
        shutil.rmtree(path)
    run = RunDir(path)
    run.path.mkdir(parents=True)
    run.write_config(config.to_dict(), "ray_vs_sim")
    runner = runner_class(config.backend)(config, run, Problem(config), config.build_algorithm())
    summary = runner.execute(Progress(enabled=False))
    run.write_summary(summary)
    log = runner.merger.log if config.backend == "ray" else runner.sim.log
    return summary, log.numpy()["staleness"]


def row(seed: int, name: str, summary: dict[str, Any], stale: np.ndarray, ms: float) -> str:
    return (
        f"| {seed} | {name} | {stale.mean():.2f} | {np.percentile(stale, 90):.0f} | "
        f"{ms:,.0f} | {100 * summary['final_test_error']:.1f}% | {summary['pushes']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--time-scale", type=float, default=0.001)
    parser.add_argument("--out", type=Path, default=Path("runs/ray-vs-sim"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    args = parser.parse_args()
    common = dict(COMMON)
    if args.smoke:
        common.update(workers=2, train_size=512, test_size=64, epochs=1)
        common["cluster"] = {
            **CLUSTER,
            "compute": {"model": "gamma", "worker_factors": [1, 2]},
            "availability": {"preemptions": [{"worker": 1, "leave_ms": 300, "rejoin_ms": 600}]},
        }
        args.seeds = args.seeds[:1]
    from dana.ps.cluster import ray_session

    print("| seed | run | staleness mean | p90 | duration (model ms) | final error | pushes |")
    print("|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"mean": [], "p90": [], "time": [], "error": []}
    fitted_errors: dict[str, list[float]] = {"mean": [], "p90": [], "time": [], "error": []}
    with ray_session(None, actors=common["workers"] + 2):
        for seed in args.seeds:
            out = args.out / f"seed{seed}"
            ray_config = TrainConfig(
                **common, seed=seed, backend="ray", time_scale=args.time_scale
            ).validate()
            ray_sum, ray_stale = execute(out / "ray", ray_config)
            sim_sum, sim_stale = execute(out / "sim", TrainConfig(**common, seed=seed).validate())
            fitted = {**common, "cluster": fit_cluster(out / "ray")}
            fit_sum, fit_stale = execute(
                out / "fitted", TrainConfig(**fitted, seed=seed).validate()
            )
            ray_ms = ray_sum["sim_time"] / args.time_scale
            print(row(seed, "Ray, emulated", ray_sum, ray_stale, ray_ms))
            print(row(seed, "simulator", sim_sum, sim_stale, sim_sum["sim_time"]))
            print(
                row(
                    seed,
                    "simulator, fitted to the Ray run",
                    fit_sum,
                    fit_stale,
                    fit_sum["sim_time"],
                )
            )
            sys.stdout.flush()
            for into, (summary, stale) in (
                (errors, (sim_sum, sim_stale)),
                (fitted_errors, (fit_sum, fit_stale)),
            ):
                into["mean"].append(ray_stale.mean() / stale.mean() - 1)
                into["p90"].append(np.percentile(ray_stale, 90) - np.percentile(stale, 90))
                into["time"].append(ray_ms / summary["sim_time"] - 1)
                into["error"].append(
                    100 * (ray_sum["final_test_error"] - summary["final_test_error"])
                )
    for name, found in (("simulator", errors), ("the fitted replay", fitted_errors)):
        print(
            f"Ray minus {name}, per seed: staleness mean "
            + ", ".join(f"{100 * e:+.1f}%" for e in found["mean"])
            + "; p90 "
            + ", ".join(f"{e:+.0f}" for e in found["p90"])
            + "; duration "
            + ", ".join(f"{100 * e:+.1f}%" for e in found["time"])
            + "; final error "
            + ", ".join(f"{e:+.1f} pp" for e in found["error"])
        )
    print(f"staleness mean error {100 * float(np.mean(np.abs(errors['mean']))):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
