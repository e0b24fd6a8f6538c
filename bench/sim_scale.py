"""Images per second of the simulator in every mode, against plain PyTorch training.

One run of ``k = 32`` simulated workers (``dana-slim``, gamma timing, batch 128 per
worker) on the small CNN (Fashion-MNIST's shape, 1x28x28) and on ResNet-20 (CIFAR's,
3x32x32), on random images, in each mode of the simulator:

- ``sequential``: one worker's gradient at a time, one intra-op thread (the default);
- ``threads N``: up to ``N`` in-flight gradients at once on ``N`` threads (one intra-op
  thread each; ``N`` = the cores), bit for bit the sequential run;
- ``batched B``: up to ``B`` in-flight gradients in one ``torch.func.vmap`` call, on the
  device (``B = k``; on the CPU with one intra-op thread per core);
- on a GPU also ``sequential graph`` and ``batched B graph``: the gradient call replayed
  as a CUDA graph (``--cuda-graph``, :mod:`dana.train.task.captured`);

against a plain PyTorch loop (``torch.optim.SGD``, momentum 0.9, Nesterov) at batch 128
at each thread setting (1, 2, 4, ... up to the cores: its best is the reference) and
synchronous training at batch ``32 x 128`` (one step on all workers' batches at once),
side by side in one process. Each figure is the best of ``--repeats`` timed chunks of
about ``--seconds`` each, after an untimed warm-up. The last line:

    parallel speed-up R

``R`` = the best simulator mode's images/s over the sequential simulator's, ``k = 32``,
CNN, on the CPU. With ``--device cuda`` the simulator's modes and the two loops also
run on the GPU (the threaded mode and the CPU loops stay on the CPU).

Run: ``python bench/sim_scale.py`` (CPU, a few minutes), ``python bench/sim_scale.py
--device cuda`` (bench/gpu.sh), ``--smoke`` (seconds, tiny sizes: the figures mean
nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import dana  # noqa: E402
from dana.models import build_model  # noqa: E402
from dana.sim import Simulator  # noqa: E402
from dana.train.task.batches import BatchStream  # noqa: E402
from dana.train.task.captured import captured_gradient  # noqa: E402
from dana.train.task.flat import FlatModel  # noqa: E402
from dana.train.task.stacked import GradientSource  # noqa: E402

SHAPES = {"cnn": (1, 28), "resnet20": (3, 32)}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def thread_settings(n: int) -> list[int]:
    out, t = [], 1
    while t < n:
        out.append(t)
        t *= 2
    return [*out, n]


class Data:
    def __init__(self, model: str, n: int, device: torch.device, image: int | None = None):
        channels, size = SHAPES[model]
        size = image or size
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, channels, size, size, generator=g).to(device)
        self.y = torch.randint(0, 10, (n,), generator=g).to(device)
        self.model, self.channels, self.size, self.device = model, channels, size, device

    def build(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(self.model, self.channels, self.size, 10).to(self.device)

    def inputs(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = rows.to(self.device)
        return self.x[rows], self.y[rows]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(step: Callable[[], int], device: torch.device, seconds: float, repeats: int) -> float:
    """Images per second of ``step`` (which returns the images it processed): the best
    of ``repeats`` chunks of about ``seconds``, after one untimed warm-up chunk."""
    best = 0.0
    for chunk in range(repeats + 1):
        images, start = 0, time.perf_counter()
        while True:
            images += step()
            if time.perf_counter() - start >= (seconds / 4 if chunk == 0 else seconds):
                break
        sync(device)
        if chunk:
            best = max(best, images / (time.perf_counter() - start))
    return best


def plain_loop(data: Data, batch: int) -> Callable[[], int]:
    model = data.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    stream = BatchStream(len(data.x), batch, seed=0)

    def step() -> int:
        x, y = data.inputs(stream.next())
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return batch

    return step


def simulator(data: Data, k: int, batch: int, batch_workers: int, threads: int, graph=False):
    flat = FlatModel(data.build())
    captured = captured_gradient(flat, F.cross_entropy) if graph else None

    def gradient(p, rows):
        if captured is not None:
            return captured(p, *data.inputs(rows))
        return flat.gradient(p, *data.inputs(rows), F.cross_entropy)

    sim = Simulator(
        dana.algorithms.build("dana-slim", momentum=0.9),
        flat.flat.clone(),
        gradient,
        BatchStream(len(data.x), batch, seed=0),
        k,
        lr=0.01,
        weight_decay=1e-4,
        timing="gamma",
        batch_workers=batch_workers,
        threads=threads,
        source=GradientSource(flat, F.cross_entropy, data.inputs, cuda_graph=graph),
    )

    def step() -> int:
        sim.step()
        return batch

    return sim, step


def measure(
    args: argparse.Namespace, model: str, device: torch.device, on_cpu: bool, on_gpu: bool
) -> dict[str, float]:
    n_cores, k, batch = cores(), args.workers, args.batch_size
    rows: dict[str, float] = {}
    where = "" if device.type == "cpu" else f" [{device.type}]"
    cpu = torch.device("cpu")
    data = Data(model, max(4 * k * batch, 1024), device, args.image)
    data_cpu = data if device.type == "cpu" else Data(model, len(data.x), cpu, args.image)

    skip = [p for p in args.cpu_skip.split(",") if p]

    def timed(name: str, make: Callable[[], Callable[[], int]], dev: torch.device, threads: int):
        if dev.type == "cpu" and (not on_cpu or any(name.startswith(p) for p in skip)):
            return
        torch.set_num_threads(threads)
        rows[name] = rate(make(), dev, args.seconds, args.repeats)
        print(f"  {model:<9} {name:<34} {rows[name]:>9.0f} images/s", flush=True)

    for t in thread_settings(n_cores):
        timed(f"plain loop b{batch}, {t} thread(s)", lambda: plain_loop(data_cpu, batch), cpu, t)
    timed(f"sync {k}x{batch}, {n_cores} thread(s)", lambda: plain_loop(data_cpu, k * batch),
          cpu, n_cores)  # fmt: skip
    timed("sim sequential, 1 thread", lambda: simulator(data_cpu, k, batch, 1, 1)[1], cpu, 1)
    if n_cores > 1:
        timed(f"sim threads {n_cores}", lambda: simulator(data_cpu, k, batch, 1, n_cores)[1],
              cpu, 1)  # fmt: skip
    for t in sorted({1, n_cores}):
        timed(f"sim batched {k}, {t} thread(s)",
              lambda: simulator(data_cpu, k, batch, k, 1)[1], cpu, t)  # fmt: skip
    if device.type != "cpu" and on_gpu:
        torch.set_num_threads(n_cores)
        timed(f"plain loop b{batch}{where}", lambda: plain_loop(data, batch), device, n_cores)
        timed(f"sync {k}x{batch}{where}", lambda: plain_loop(data, k * batch), device, n_cores)
        timed(f"sim sequential{where}", lambda: simulator(data, k, batch, 1, 1)[1], device, 1)
        timed(f"sim batched {k}{where}", lambda: simulator(data, k, batch, k, 1)[1], device, 1)
        timed(f"sim sequential graph{where}", lambda: simulator(data, k, batch, 1, 1, True)[1],
              device, 1)  # fmt: skip
        timed(f"sim batched {k} graph{where}", lambda: simulator(data, k, batch, k, 1, True)[1],
              device, 1)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--models", default="cnn,resnet20")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=6.0, help="per timed chunk")
    parser.add_argument("--repeats", type=int, default=2, help="timed chunks per figure")
    parser.add_argument("--image", type=int, default=None, help="image side (smaller: faster)")
    parser.add_argument("--gpu-models", default=None, help="with --device cuda (default: --models)")
    parser.add_argument("--cpu-skip", default="", help="CPU rows to leave out, by name prefix")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args()
    if args.smoke:
        args.workers, args.batch_size, args.seconds, args.repeats = 4, 8, 0.2, 1
        args.image, args.models = 8, "cnn"
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {cores()} core(s), device {device}, k = {args.workers}, "
          f"batch {args.batch_size}")  # fmt: skip
    results = {}
    cpu_models = args.models.split(",")
    gpu_models = (args.gpu_models or args.models).split(",") if device.type != "cpu" else []
    for model in dict.fromkeys(cpu_models + gpu_models):
        results[model] = rows = measure(args, model, device, model in cpu_models,
                                        model in gpu_models)  # fmt: skip
        cpu_rows = [n for n in rows if "[" not in n]
        plains = [rows[n] for n in cpu_rows if n.startswith("plain loop")]
        if plains and "sim sequential, 1 thread" in rows:  # (not when --cpu-skip left them out)
            plain = max(plains)
            seq = rows["sim sequential, 1 thread"]
            best_name = max((n for n in cpu_rows if n.startswith("sim")), key=rows.get)
            print(f"  {model}: best CPU mode {best_name!r}: {rows[best_name] / seq:.2f}x "
                  f"sequential, {rows[best_name] / plain:.2f}x the plain loop's best")  # fmt: skip
        gpu = [n for n in rows if "[" in n]
        if all(
            any(n.startswith(p) for n in gpu) for p in ("sync", "sim sequential", "sim batched")
        ):
            sync_gpu = next(rows[n] for n in gpu if n.startswith("sync"))
            seq_gpu = next(rows[n] for n in gpu if n.startswith("sim sequential"))
            for name in (n for n in gpu if n.startswith("sim batched")):
                label = "batched graph" if "graph" in name else "batched"
                print(f"  {model}: GPU {label} {rows[name] / sync_gpu:.2f}x synchronous, "
                      f"{rows[name] / seq_gpu:.2f}x sequential")  # fmt: skip
    cnn = results["cnn"] if "cnn" in cpu_models else results[cpu_models[0]]
    seq = cnn.get("sim sequential, 1 thread")
    sims = [v for n, v in cnn.items() if n.startswith("sim") and "[" not in n]
    if seq is None or not sims:
        print("parallel speed-up not measured (--cpu-skip left out the CPU simulator rows)")
    else:
        print(f"parallel speed-up {max(sims) / seq:.2f}")


if __name__ == "__main__":
    main()
