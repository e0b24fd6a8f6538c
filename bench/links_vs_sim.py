"""Does the simulator predict a Ray run over real, bandwidth-limited links?

A Ray cluster on one machine (:mod:`dana.ps.netlab`, root): the head (the driver, two
server shards) and one node per worker, each behind its own veth link shaped by tc's
token bucket; half the workers on a fast link, half on a slow one. ``dana-slim``, k = 8,
``--servers 2 --no-standby``, an MLP of 820,874 parameters (a 3.3 MB push, 0.83 MB with
``int8``) on a synthetic 3x32x32 task. Each Ray run is then simulated on a cluster model
built from the run's own records (:func:`dana.train.cluster.fit.fit_cluster`: compute,
worker factors) and the links as configured:

- **links**: each worker's bandwidth its link's rate times :data:`PAYLOAD_SHARE` (a
  TCP/IPv4 segment with timestamps carries 1,448 bytes of a 1,514-byte frame), no
  latency: a prediction of the exchange from the links alone;
- **links + residual**: the same, plus a latency per worker of half the median cycle
  left after its step and the modelled transfers (what the Ray call costs beyond the
  link, fitted from the run);
- **links + other seeds' residual**: the residual of the other seeds' runs of the same
  codec instead (per link class, their workers' mean): out of sample, once every Ray run
  is done (``--held-out-only`` on the records in ``--out``).

Compared: the run's duration, its time to 25% test error on the curve's descent
(interpolated between evaluations), its first evaluation at or below the plateau (the
highest of the Ray runs' best errors), the final test error and the mean staleness,
per run and, per codec, over the seeds. Ray's times are wall seconds of training, the
simulator's model ms / 1000.

Run (root, from the repository root): ``python bench/links_vs_sim.py`` (2 codecs x 3
seeds, about 16 minutes on 2 shared cores), ``--smoke`` for a tiny run (2 workers, about
a minute), ``--report-only`` for the tables again from the records in ``--out``. The
last line is the largest |simulated / measured - 1| of the duration over the runs, for
the "links + residual" prediction:

    duration error P%
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import parse_with_smoke
from ray_vs_sim import execute

from dana.ps.netlab import NetLab, Node, unavailable
from dana.train.cluster.fit import fit_cluster
from dana.train.config import TrainConfig

#: Share of a shaped link's rate that carries payload (TCP/IPv4, timestamps, Ethernet).
PAYLOAD_SHARE = 1448 / 1514
OPTIONS: dict[str, Any] = dict(
    algorithm="dana-slim",
    workers=8,
    servers=2,
    dataset="tensors",
    model="mlp",
    epochs=3,
    batch_size=32,
    lr=0.02,
    warmup_epochs=0.5,
    eval_every=0.125,
)
SIZES = dict(train_size=4096, test_size=1000)
#: The task's pixel noise (the generator's default, 2, is learnt to 0% error in an epoch).
NOISE = 8.0


def write_data(path: Path, smoke: bool) -> None:
    """The task: the synthetic generator's 3x32x32 images (an MLP of 820,874 parameters)."""
    from dana.data.synthetic import make_synthetic

    sizes = dict(train_size=256, test_size=64) if smoke else SIZES
    tx, ty, vx, vy = make_synthetic(0, channels=3, image_size=32, noise=NOISE, **sizes)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, train_x=tx.numpy(), train_y=ty.numpy(), test_x=vx.numpy(), test_y=vy.numpy())


def links_model(run: Path, gbps: list[float], residual: bool, config: TrainConfig) -> dict:
    """The cluster model fitted to ``run`` with each worker's link at ``gbps`` (its
    payload rate), no latency or (``residual``) the fit's leftover per worker."""
    from dana.models.registry import build_model, count_parameters
    from dana.train.cluster.network import Network
    from dana.train.rules.codecs import build_codec

    fitted = fit_cluster(run)
    latency = [0.0] * len(gbps)
    if residual:
        links = {"latency_ms": 0, "bandwidth_gbps": gbps, "server_bandwidth_gbps": None,
                 "bytes_per_value": None}  # fmt: skip
        d = count_parameters(build_model(config.model, 3, 32, 10))
        net = Network(links, len(gbps), config.servers, d, 4.0,
                      build_codec(config.compress))  # fmt: skip
        # the fit's latency is half the cycle beyond the step; the links take some of it
        transfer = [(p + w) / 2 for p, w in zip(net.push_worker_ms, net.worker_ms, strict=True)]
        latency = [
            max(0.0, f - t) for f, t in zip(fitted["network"]["latency_ms"], transfer, strict=True)
        ]
    fitted["network"] = {"latency_ms": latency, "bandwidth_gbps": gbps,
                         "server_bandwidth_gbps": None, "bytes_per_value": None}  # fmt: skip
    return fitted


#: Seconds per unit of each run's clock: Ray's wall seconds, the simulator's model ms.
SCALE = {"ray": 1.0, "links": 1e-3, "residual": 1e-3, "held_out": 1e-3}
#: The predictions and their names in the tables.
PREDICTIONS = {
    "links": "sim, links",
    "residual": "sim, links + residual",
    "held_out": "sim, links + other seeds' residual",
}
#: The error whose time is compared on the curves' descent (interpolated between
#: evaluations): the plateau's first crossing is mostly the runs' noise.
TARGET = 0.25


def curve(run: Path, seconds_per_unit: float) -> tuple[np.ndarray, np.ndarray]:
    """The run's evaluations: times (s) and test errors."""
    rows = np.genfromtxt(run / "metrics.csv", delimiter=",", names=True)
    return rows["sim_time"] * seconds_per_unit, rows["test_error"]


def time_to(times: np.ndarray, errors: np.ndarray, target: float, between: bool) -> float:
    """When the run first reaches ``target``: that evaluation's time, or (``between``)
    the linear interpolation from the evaluation before it (NaN: never)."""
    hit = np.flatnonzero(errors <= target + 1e-12)
    if not hit.size:
        return float("nan")
    j = int(hit[0])
    if not between or j == 0:
        return float(times[j])
    share = (errors[j - 1] - target) / (errors[j - 1] - errors[j])
    return float(times[j - 1] + share * (times[j] - times[j - 1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--codecs", nargs="+", default=["none", "int8"])
    parser.add_argument("--fast", type=float, default=100.0, help="fast links, Mbit/s")
    parser.add_argument("--slow", type=float, default=25.0, help="slow links, Mbit/s")
    parser.add_argument("--epochs", type=float, default=OPTIONS["epochs"])
    parser.add_argument("--out", type=Path, default=Path("runs/links-vs-sim"))
    parser.add_argument(
        "--report-only", action="store_true", help="the tables again from OUT's records"
    )
    parser.add_argument(
        "--held-out-only",
        action="store_true",
        help="only the simulations with the other seeds' residual, of the runs in OUT",
    )
    args = parse_with_smoke(parser)
    if args.report_only or args.held_out_only:
        rows = json.loads((args.out / "report.json").read_text())["rows"]
        for row in rows:  # (the residual latencies, fitted again)
            base = args.out / f"{row['codec']}-seed{row['seed']}"
            on_ray = TrainConfig(**json.loads((base / "config.json").read_text()))
            model = links_model(base / "ray", row["gbps"], True, on_ray)
            row["residual_ms"] = model["network"]["latency_ms"]
        if args.held_out_only:
            held_out(rows, args.out)
        return report(rows, args.out)
    why = unavailable()
    if why:
        print(f"links_vs_sim: {why}", file=sys.stderr)
        return 2
    options = dict(OPTIONS, epochs=args.epochs)
    if args.smoke:
        options.update(workers=2, epochs=2, batch_size=16, eval_every=0.5)
        args.fast, args.slow = 4 * args.fast, 4 * args.slow
        args.seeds, args.codecs = args.seeds[:1], args.codecs[:1]
        args.out = args.out.with_name(args.out.name + "-smoke")  # (never over a study)
    k = options["workers"]
    data = args.out.resolve() / "data.npz"
    write_data(data, args.smoke)
    options.update(data_dir=str(data))
    mbit = {f"n{i}": args.fast if i < k // 2 else args.slow for i in range(k)}
    rows: list[dict[str, Any]] = []
    started = time.time()
    with NetLab([Node(name, m) for name, m in mbit.items()], options["servers"]) as lab:
        print(f"lab up in {time.time() - started:.0f} s: {k} worker nodes", file=sys.stderr)
        for codec in args.codecs:
            for seed in args.seeds:
                row = compare(lab, mbit, dict(options, compress=codec, seed=seed), args.out)
                if row is not None:
                    rows.append(row)
                    report(rows, args.out, quiet=True)  # (what is done so far, kept)
                print(f"{codec} seed {seed} done at {time.time() - started:.0f} s", file=sys.stderr)
    held_out(rows, args.out)
    return report(rows, args.out)


def compare(
    lab: NetLab, mbit: dict[str, float], options: dict[str, Any], out: Path
) -> dict[str, Any] | None:
    """One Ray run on ``lab`` and its two simulations, into ``out/CODEC-seedSEED``; the
    row of figures (None: the Ray run failed, said on stderr)."""
    on_ray = TrainConfig(**options, backend="ray", standby=False).validate()
    base = out / f"{on_ray.compress}-seed{on_ray.seed}"
    ray_run = base / "ray"
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps(on_ray.to_dict()))
    shutil.rmtree(ray_run, ignore_errors=True)
    done = lab.train(["--config", str(base / "config.json"), "--quiet", "--out", str(ray_run)], 900)
    if done.returncode != 0:
        print(f"{base.name}: the Ray run failed: {done.stderr[-2000:]}", file=sys.stderr)
        return None
    where = lab.nodes_of(ray_run)
    workers = [where[f"worker{i}"] for i in range(on_ray.workers)]
    servers = [where[f"shard{s}"] for s in range(on_ray.servers)]
    gbps = [PAYLOAD_SHARE * mbit[node] / 1000 for node in workers]
    row: dict[str, Any] = {
        "codec": on_ray.compress,
        "seed": on_ray.seed,
        "placed": set(servers) == {"head"} and sorted(workers) == sorted(mbit),
        "gbps": gbps,
        "ray": json.loads((ray_run / "summary.json").read_text()),
    }
    for name, residual in (("links", False), ("residual", True)):
        model = links_model(ray_run, gbps, residual, on_ray)
        row[name], _ = execute(base / name, TrainConfig(**options, cluster=model).validate())
        if residual:
            row["residual_ms"] = model["network"]["latency_ms"]
    return row


def held_out(rows: list[dict[str, Any]], out: Path) -> None:
    """Simulate each run with the residual of the *other* seeds of its codec: per link
    class (rate), the mean of their workers' residual latencies; an out-of-sample
    prediction (``row["held_out"]``). Runs without another seed are left out."""
    for row in rows:
        others = [r for r in rows if r["codec"] == row["codec"] and r["seed"] != row["seed"]]
        if not others:
            continue
        by_rate: dict[float, list[float]] = {}
        for other in others:
            for gbps, ms in zip(other["gbps"], other["residual_ms"], strict=True):
                by_rate.setdefault(gbps, []).append(ms)
        base = out / f"{row['codec']}-seed{row['seed']}"
        options = json.loads((base / "config.json").read_text())
        if not Path(options["data_dir"]).is_file():  # (records moved: the same task again)
            options["data_dir"] = str((out / "data.npz").resolve())
            write_data(Path(options["data_dir"]), smoke=False)
        model = links_model(base / "ray", row["gbps"], False, TrainConfig(**options))
        model["network"]["latency_ms"] = [float(np.mean(by_rate[g])) for g in row["gbps"]]
        options.update(backend="sim", standby=True, cluster=model)
        row["held_out"], _ = execute(base / "held_out", TrainConfig(**options).validate())


def spread(values: list[float], unit: str, digits: int) -> str:
    """``mean [min, max]`` of ``values``."""
    return f"{np.mean(values):+.{digits}f} [{min(values):+.{digits}f}, {max(values):+.{digits}f}] {unit}"


def summary_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per codec and prediction, over the seeds: the simulated duration and time to
    :data:`TARGET` relative to Ray's, and the final error's difference (beside the spread
    of Ray's final errors over the seeds)."""
    lines = [
        f"| codec | prediction | seeds | duration | to {100 * TARGET:.0f}% | final error, sim "
        "minus Ray | Ray's final errors (spread) |",
        "|---|---|---|---|---|---|---|",
    ]
    for codec in dict.fromkeys(r["codec"] for r in rows):
        mine = [r for r in rows if r["codec"] == codec]
        ray_errors = [100 * r["ray"]["final_test_error"] for r in mine]
        for name in (n for n in PREDICTIONS if all(n in r for r in mine)):
            off = {
                key: [100 * (r[f"{name}_times"][key] / r["ray_times"][key] - 1) for r in mine]
                for key in ("duration", "to_target")
            }
            errors = [
                100 * (r[name]["final_test_error"] - r["ray"]["final_test_error"]) for r in mine
            ]
            lines.append(
                f"| {codec} | {name} | {', '.join(str(r['seed']) for r in mine)} | "
                f"{spread(off['duration'], '%', 1)} | {spread(off['to_target'], '%', 1)} | "
                f"{spread(errors, 'pp', 2)} | "
                f"{', '.join(f'{e:.1f}' for e in ray_errors)}% "
                f"({max(ray_errors) - min(ray_errors):.1f} pp) |"
            )
    return lines


def report(rows: list[dict[str, Any]], out: Path, quiet: bool = False) -> int:
    """Write the table to ``out/table.md`` (and print it unless ``quiet``), the figures
    to ``out/report.json``."""
    if not rows:
        print("no run finished", file=sys.stderr)
        return 1
    names = {"ray": "Ray"} | {n: label for n, label in PREDICTIONS.items() if n in rows[0]}
    curves = {}
    for row in rows:
        base = out / f"{row['codec']}-seed{row['seed']}"
        for name in names:
            curves[(row["codec"], row["seed"], name)] = curve(base / name, SCALE[name])
    floor = max(float(np.min(curves[(r["codec"], r["seed"], "ray")][1])) for r in rows)
    lines = [
        f"| codec | seed | run | duration (s) | to {100 * TARGET:.0f}% (s) | "
        f"to {100 * floor:.1f}% (s) | final error | staleness mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for row in rows:
        measured: dict[str, float] = {}
        for name, label in names.items():
            summary, errors = row[name], curves[(row["codec"], row["seed"], name)]
            figures = {
                "duration": summary["sim_time"] * SCALE[name],
                "to_target": time_to(*errors, TARGET, between=True),
                "to_floor": time_to(*errors, floor, between=False),
            }
            row[f"{name}_times"] = figures
            cells = []
            for key, value in figures.items():
                measured.setdefault(key, value)
                off = "" if name == "ray" else f" ({100 * (value / measured[key] - 1):+.0f}%)"
                cells.append(f"{value:.1f}{off}")
            if name == "ray" and not row["placed"]:
                label += " (misplaced)"
            lines.append(
                f"| {row['codec']} | {row['seed']} | {label} | {' | '.join(cells)} | "
                f"{100 * summary['final_test_error']:.1f}% | {summary['mean_staleness']:.2f} |"
            )
            if name == "residual":
                worst = max(worst, abs(figures["duration"] / measured["duration"] - 1))
        residual = row.get("residual_ms") or []
        for cls, gbps in (("fast", max(row["gbps"])), ("slow", min(row["gbps"]))):
            ms = [r for r, g in zip(residual, row["gbps"], strict=False) if g == gbps]
            row[f"{cls}_residual_ms"] = float(np.mean(ms)) if ms else None
    lines += ["", *summary_table(rows), "", f"duration error {100 * worst:.1f}%"]
    (out / "report.json").write_text(json.dumps({"floor": floor, "rows": rows}, indent=1))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
