"""text-diloco's two tables in docs/RESULTS.md, from its committed records.

    python scripts/text_diloco_tables.py docs/results/text-diloco

Final test loss per method, k and cluster (mean [seeds' range]), then paired per-seed
differences, then each method's simulated time to the byte bigram model's loss (the mean
over seeds, where every seed reached it; evaluated every quarter epoch). A pair is "ahead" ("behind") when the first ends lower (higher) on every
seed, "within noise" besides when its mean is smaller than the one-worker baseline's
seed spread, else "level"; a diverged seed makes the pair's cell "diverged".
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.experiments.intervals import interval  # noqa: E402

CLUSTERS = ("wan", "wan-mixed", "wan-skewed")
METHODS = {
    "diloco": "synchronous DiLoCo",
    "local-nesterov": "asynchronous Local-SGD, outer Nesterov (naive)",
    "local-dn": "Delayed Nesterov",
    "local-dn + DyLU": "Delayed Nesterov + DyLU",
    "dana-local": "DANA-Local",
    "dana-local + DyLU": "DANA-Local + DyLU",
    "dana-slim": "DANA-Slim",
    "asgd": "ASGD",
}
PAIRS = {
    ("local-dn + DyLU", "diloco"): "DN + DyLU minus DiLoCo",
    ("diloco", "local-nesterov"): "DiLoCo minus naive",
    ("local-dn + DyLU", "local-nesterov"): "DN + DyLU minus naive",
    ("local-dn + DyLU", "local-dn"): "DN + DyLU minus DN",
    ("dana-local", "diloco"): "DANA-Local minus DiLoCo",
    ("dana-local", "local-nesterov"): "DANA-Local minus naive",
    ("dana-local", "dana-slim"): "DANA-Local minus DANA-Slim",
}


def read(root: Path) -> tuple[dict, dict, float]:
    """Final test loss (NaN: diverged) and the simulated seconds to the bigram's loss
    (None: not reached) by (method, k, cluster) and seed; the bigram's loss."""
    final: dict[tuple[str, int, str], dict[int, float]] = defaultdict(dict)
    reached: dict[tuple[str, int, str], dict[int, float | None]] = defaultdict(dict)
    bigram = math.nan
    for run in sorted((root / "runs").iterdir()):
        summary = json.loads((run / "summary.json").read_text())
        config = json.loads((run / "config.json").read_text())
        cluster = config["cluster"]
        cluster = cluster["name"] if isinstance(cluster, dict) else cluster
        dylu = (config.get("algorithm_params") or {}).get("dynamic_steps")
        method = config["algorithm"] + (" + DyLU" if dylu else "")
        loss = math.nan if summary["diverged"] else summary["final_test_loss"]
        key, seed = (method, config["workers"], cluster), config["seed"]
        final[key][seed] = loss
        bigram = summary.get("reference_losses", {}).get("bigram", bigram)  # (not if diverged)
        with (run / "metrics.csv").open() as f:
            rows = [r for r in csv.DictReader(f) if r["test_loss"] not in ("", "nan")]
        times = [float(r["sim_time"]) / 1000 for r in rows if float(r["test_loss"]) <= bigram]
        reached[key][seed] = times[0] if times else None
    return final, reached, bigram


def loss_cell(by_seed: dict[int, float]) -> str:
    values = [by_seed[s] for s in sorted(by_seed)]
    lost = sum(math.isnan(v) for v in values)
    if lost == len(values):
        return f"diverged ({lost} of {lost})"
    if lost:
        kept = ", ".join(f"{v:.2f}" for v in values if not math.isnan(v))
        return f"{kept}; diverged {lost} of {len(values)}"
    low, high = interval(np.array(values))
    return f"{np.mean(values):.3f} [{low:.2f}, {high:.2f}]"


def pair_cell(a: dict[int, float], b: dict[int, float], noise: float) -> str:
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds])
    if np.isnan(d).any():
        return "diverged"
    if (d < 0).all() or (d > 0).all():
        word = "ahead" if d.mean() < 0 else "behind"
        word += ", within noise" if abs(d.mean()) < noise else ""
    else:
        word = "level"
    return f"{d.mean():+.2f} [{d.min():+.2f}, {d.max():+.2f}] {word}"


def main() -> None:
    final, reached, bigram = read(
        Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/text-diloco")
    )
    base = list(final[("dana-slim", 1, "wan")].values())
    noise = max(base) - min(base)
    head = " | ".join(f"k = {k}: {c}" for k in (4, 16) for c in CLUSTERS)
    print(f"| method | {head} |\n|---|" + "---|" * 6)
    for m, name in METHODS.items():
        cells = " | ".join(loss_cell(final[(m, k, c)]) for k in (4, 16) for c in CLUSTERS)
        print(f"| {name} | {cells} |")
    print(f"\nnoise: the one-worker baseline's seed spread, {noise:.3f} nats\n")
    print(f"| pair | {head} |\n|---|" + "---|" * 6)
    for (a, b), name in PAIRS.items():
        cells = " | ".join(
            pair_cell(final[(a, k, c)], final[(b, k, c)], noise) for k in (4, 16) for c in CLUSTERS
        )
        print(f"| {name} | {cells} |")
    print(f"\n| seconds to the bigram's loss ({bigram:.4f}) | {head} |\n|---|" + "---|" * 6)
    for m, name in METHODS.items():
        times = [reached[(m, k, c)] for k in (4, 16) for c in CLUSTERS]
        cells = " | ".join(
            f"{np.mean(list(t.values())):.0f}" if all(v is not None for v in t.values()) else "—"
            for t in times
        )
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
