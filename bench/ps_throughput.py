"""How many pushes per second does dana's parameter server take, against Ray's own example?

Workers send precomputed messages as fast as they can; the number that counts is pushes
applied per second at the server, measured over a window after a warm-up (the object
store's pages are touched for the first time during the warm-up).

- dana: the real :class:`dana.ps.shard.ShardServer` (``dana-slim``: the master does
  ``Theta -= lr*u``) and the real protocol (:mod:`dana.ps.protocol`: a
  :class:`~dana.ps.protocol.Push` split into the shards' parts), a worker calling every
  shard itself (:class:`DirectLink`, here: a run's workers call shard 0 only, which
  relays): each step is one ``exchange`` call per shard (push, then pull the new
  parameters), numpy arrays through Ray's object store. The server also keeps the run's
  log and measures staleness and gap, as in a real run.
- ray example: the pattern of Ray's parameter-server example
  (ray-project/ray, doc/source/ray-core/examples/plot_parameter_server.ipynb,
  asynchronous version): the driver waits for gradients in completion order
  (``ray.wait``), calls ``ps.apply_gradients`` (numpy gradients per layer, ``np.stack``,
  ``torch.optim.SGD.step()``, returns ``model.get_weights()``, a dict of torch tensors)
  and hands the new weights to the worker's ``compute_gradients``, which loads them
  (``load_state_dict``) and returns its precomputed per-layer gradients.
- copy: one ``np.copyto`` of ``d`` float32 in the driver, the floor for anything that
  touches every parameter.
- standby: what shard 0's standby replica costs (docs/DISTRIBUTED.md, "Shard 0's
  standby"): dana as a run uses it, the workers calling shard 0 only
  (:class:`dana.ps.link.ServerLink`, ``relay_exchange`` on a
  :class:`dana.ps.head.HeadServer`), which relays to the other shards, with and without
  the standby
  (``--no-standby``), while the driver's work goes on as in a run (every 0.2 s it polls
  the standby and the other shards, keeps their recovery snapshots, taken once a second,
  and trims the logs to them). Measured in the order without, with, with, without, so
  that a drift of the machine's load weighs on both alike.
- codecs: dana with each codec of ``--compress`` (:mod:`dana.train.rules.codecs`) at the large
  size, 4 workers, one shard: pushes per second at the server (each worker sends its
  message encoded once, beforehand, as the plain rows send a precomputed message: the
  server decodes every push), the bytes of a push, and the encode and decode times of
  one message in this process on one thread (``torch.set_num_threads(1)``: a worker's
  cost per push, and the server's decode).

Sizes: d = 272,474 (ResNet-20 with projection shortcuts: 65 tensors) and d = 25,557,032
(ResNet-50: 161 tensors); the example's model has those tensor shapes. Then dana with
``--servers`` 1, 2 and 4 at the large size and 8 workers, and the server's peak memory
(private, anonymous pages: what the server process itself allocated, ``RssAnon``
sampled at every push; and ``VmHWM``, the peak resident size, which also counts the
object store's shared pages the process read) with dana-slim at k = 1 and k = 8. The
standby's rows are at d = 272,474 with 4 workers and ``--servers`` 1 and 2.

Run: ``python bench/ps_throughput.py`` (about 5 minutes on 2 cores, 2 more for the
standby's rows and 1 for the codecs'; ``--quick`` for a
smoke run; ``--smoke``: a tiny model in seconds, to check the script runs;
``--standby``: the standby's rows only, whose last line is ``standby with/without S=1
R1, S=2 R2``; ``--codecs``: the codecs' rows only, whose last line is ``codecs
pushes/s vs none: fp16 R, ...``). The last line is dana's throughput over the example's at d = 25,557,032 with
4 workers:

    throughput vs ray example R
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.ps.cluster import local_system_config  # noqa: E402
from dana.ps.group import POLL_SECONDS  # noqa: E402
from dana.ps.head import HeadServer  # noqa: E402
from dana.ps.layout import Layout  # noqa: E402
from dana.ps.link import ServerLink  # noqa: E402
from dana.ps.protocol import Pulled, Push, split  # noqa: E402
from dana.ps.settings import server_settings  # noqa: E402
from dana.ps.shard import ShardServer  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.rules.codecs import Wire, build_codec  # noqa: E402

SMALL, LARGE = 272_474, 25_557_032


def resnet20_shapes() -> list[tuple[int, ...]]:
    """ResNet-20 (CIFAR) with 1x1 projection shortcuts: 272,474 parameters."""
    from dana.models import build_model

    model = build_model("resnet20", in_channels=3, image_size=32, num_classes=10)
    shapes = [tuple(p.shape) for p in model.parameters()]
    return shapes + [(32, 16, 1, 1), (32,), (32,), (64, 32, 1, 1), (64,), (64,)]


def resnet50_shapes() -> list[tuple[int, ...]]:
    """ResNet-50 (ImageNet) parameter shapes: 25,557,032 parameters."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,)]
            shapes += [(planes, planes, 3, 3), (planes,), (planes,)]
            shapes += [(planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


SHAPES = {SMALL: resnet20_shapes, LARGE: resnet50_shapes}
#: ``--smoke``: one tiny model (two tensors) stands for both sizes.
SMOKE = 64 * 32 + 32
SMOKE_SHAPES = {SMOKE: lambda: [(64, 32), (32,)]}


class LayerModel(torch.nn.Module):
    """The example's model: parameters of the given shapes, with its weight helpers."""

    def __init__(self, shapes: list[tuple[int, ...]]):
        super().__init__()
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(shape)) for shape in shapes
        )

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in self.state_dict().items()}

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.load_state_dict(weights)

    def set_gradients(self, gradients: list[np.ndarray]) -> None:
        for g, p in zip(gradients, self.parameters()):
            if g is not None:
                p.grad = torch.from_numpy(g)


@ray.remote(num_cpus=1)
class ExampleServer:
    """Ray's example parameter server (plot_parameter_server.ipynb), unchanged."""

    def __init__(self, shapes: list[tuple[int, ...]], lr: float):
        torch.set_num_threads(1)
        self.model = LayerModel(shapes)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.applied = 0

    def apply_gradients(self, *gradients):
        summed_gradients = [np.stack(gradient_zip).sum(axis=0) for gradient_zip in zip(*gradients)]
        self.optimizer.zero_grad()
        self.model.set_gradients(summed_gradients)
        self.optimizer.step()
        self.applied += 1
        return self.model.get_weights()

    def get_weights(self):
        return self.model.get_weights()

    def count(self) -> int:
        return self.applied


class Measured:
    """A dana server (the class it is mixed into), also timing its ``exchange`` handler
    and sampling its memory."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.handler_seconds = 0.0
        self.peak_anon = _status_kb("RssAnon")

    def exchange(self, push: Push) -> Any:
        start = time.perf_counter()
        reply = super().exchange(push)
        self.handler_seconds += time.perf_counter() - start
        self.peak_anon = max(self.peak_anon, _status_kb("RssAnon"))
        return reply

    def copy_seconds(self, repeats: int = 3) -> float:
        """One ``np.copyto`` of this shard's ``d`` floats, here, under the current load."""
        a = self.master.theta.numpy()
        b = np.empty_like(a)
        np.copyto(b, a)  # first touch
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.copyto(b, a)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def stats(self) -> dict[str, float]:
        return {
            "pushes": self.pushes,
            "handler": self.handler_seconds,
            "cpu": time.process_time(),
            "peak_anon_mb": self.peak_anon / 1024,
            "hwm_mb": _status_kb("VmHWM") / 1024,
        }


class MeasuredShard(Measured, ShardServer):
    """A shard, measured."""


class MeasuredHead(Measured, HeadServer):
    """Shard 0 of a run (the head, or its standby), measured."""


class DirectLink:
    """A worker calling every shard itself, concurrently (no relay: a run's workers call
    shard 0 only, :class:`dana.ps.link.ServerLink`): a pull asks every shard and joins
    the replies into one flat vector (with one shard, the reply itself, read-only,
    straight from Ray's object store: no copy); a push sends each shard its part."""

    def __init__(self, servers: list[Any], layout: Layout, worker: int):
        self.servers, self.layout, self.worker = servers, layout, worker
        self.buffer = torch.empty(layout.d, dtype=torch.float32) if len(servers) > 1 else None

    def pull(self, join: bool = False) -> Pulled:
        """Shard 0's reply (its last seq is the worker's)."""
        return ray.get([s.pull.remote(self.worker, join) for s in self.servers])[0]

    def exchange(self, push: Push) -> torch.Tensor | None:
        """Push and pull in one round trip: the parameters (None if a shard served none)."""
        parts = split(push, self.layout)
        replies = ray.get([s.exchange.remote(p) for s, p in zip(self.servers, parts)])
        if any(r.params is None for r in replies):
            return None
        if self.buffer is None:
            return torch.from_numpy(replies[0].params)
        for (lo, hi), r in zip(self.layout.bounds, replies):
            self.buffer[lo:hi].copy_(torch.from_numpy(r.params))
        return self.buffer


@ray.remote(num_cpus=1)
class BenchWorker:
    """Holds a precomputed message; speaks dana's protocol or the example's."""

    def __init__(self, d: int, seed: int):
        torch.set_num_threads(1)
        rng = np.random.default_rng(seed)
        self.message = rng.standard_normal(d, dtype=np.float32) * 1e-6
        self.offset = np.zeros(d, np.float32)
        self.model: LayerModel | None = None
        self.gradients: list[np.ndarray] = []
        self.sent: Any = self.message  # what a push carries (encoded: :meth:`encode`)

    def encode(self, spec: str, servers: int) -> int:
        """Send the message through codec ``spec`` (encoded once, here: its payloads);
        the bytes of a push."""
        if spec == "none":
            self.sent = self.message
            return self.message.nbytes
        wire = Wire(build_codec(spec), 1, len(self.message), servers)
        self.sent = wire.encode(0, torch.from_numpy(self.message))
        return sum(p.nbytes for p in self.sent)

    def connect(
        self, servers: list[Any], d: int, worker: int, seed: int, head: str | None = None
    ) -> None:
        """Talk to ``servers``: each shard directly, or (``head``: the name of shard 0's
        actor) shard 0 only, which relays to the others, as a run's workers do."""
        layout = Layout(d, len(servers), seed)
        if head is None:
            self.link = DirectLink(servers, layout, worker)
        else:
            self.link = ServerLink(head, layout, worker, torch.float32)
        self.worker = worker

    def run_dana(self, seconds: float, offsets: bool) -> int:
        """Exchange the message with the servers until ``seconds`` have passed."""
        seq = self.link.pull(join=True).last_seq
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            seq += 1
            offset = self.offset if offsets else None
            self.link.exchange(Push(self.worker, seq, self.sent, 0.0, offset))
        return seq

    def setup_example(self, shapes: list[tuple[int, ...]]) -> None:
        self.model = LayerModel(shapes)
        flat, offset = self.message, 0
        self.gradients = []
        for shape in shapes:
            n = math.prod(shape)
            self.gradients.append(flat[offset : offset + n].reshape(shape))
            offset += n

    def compute_gradients(self, weights):
        self.model.set_weights(weights)
        return self.gradients


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def copy_seconds(d: int) -> float:
    a = np.random.default_rng(0).standard_normal(d, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def dana_servers(d: int, workers: int, servers: int) -> list[Any]:
    config = TrainConfig(
        algorithm="dana-slim", workers=workers, servers=servers, lr=1e-3, warmup_epochs=0
    )
    layout = Layout(d, servers, 0)
    initial = np.zeros(d, np.float32)
    settings = server_settings(config, d, 1 << 40)
    for head_only in ("bound", "timeout", "log_bytes"):  # (shard 0 is a plain shard here)
        settings[0].pop(head_only)
    actor = ray.remote(MeasuredShard).options(num_cpus=1)
    handles = [
        actor.remote(initial[lo:hi], **settings[s], end=None, evals=[], checkpoints=[])
        for s, (lo, hi) in enumerate(layout.bounds)
    ]
    ray.get([h.begin.remote(time.time()) for h in handles])
    return handles


class RelayedServers:
    """dana's servers as a run has them (:class:`dana.ps.driver.RayRun`): named shards,
    shard 0 relaying to the others and, with ``standby``, to its standby first."""

    def __init__(self, d: int, workers: int, servers: int, standby: bool):
        config = TrainConfig(
            algorithm="dana-slim", workers=workers, servers=servers, lr=1e-3, warmup_epochs=0,
            standby=standby,
        )  # fmt: skip
        bounds = Layout(d, servers, 0).bounds
        initial = np.zeros(d, np.float32)
        settings = server_settings(config, d, 1 << 40)
        common = dict(end=None, evals=[], checkpoints=[])
        self.names = names = [f"bench-{uuid.uuid4().hex[:8]}-shard{s}" for s in range(servers)]
        head, shard = ray.remote(MeasuredHead), ray.remote(MeasuredShard)
        parts = [initial[lo:hi] for lo, hi in bounds]
        self.shards = [
            head.options(name=names[0], num_cpus=1).remote(
                parts[0], **settings[0], **common, peers=names[1:] or None, replicated=standby
            )
        ]
        for s in range(1, servers):
            self.shards.append(
                shard.options(name=names[s], num_cpus=1).remote(parts[s], **settings[s], **common)
            )
        self.standby = (
            head.options(num_cpus=1).remote(
                parts[0], **settings[0], **common, peers=names[1:] or None, standby=True
            )
            if standby
            else None
        )
        self.actors = [*self.shards, *([self.standby] if standby else [])]
        self.ready = [a.ready.remote() for a in self.actors]  # (they start meanwhile)

    def start(self) -> RelayedServers:
        """Once every actor has started: attach the standby, start the clocks."""
        ray.get(self.ready)
        if self.standby is not None:
            ray.get(self.shards[0].attach_standby.remote(self.standby))
        ray.get([a.begin.remote(time.time()) for a in self.actors])
        return self

    def tend(self, seconds: float) -> None:
        """Wait ``seconds`` doing the driver's work of a run meanwhile: every
        ``POLL_SECONDS`` poll the head, the standby and the other shards (their logs
        drained), keep the recovery snapshots they carry (once a second) and trim the
        head's and the standby's logs to them."""
        receivers = {s: shard for s, shard in enumerate(self.shards) if s > 0}
        if self.standby is not None:
            receivers[0] = self.standby
        keepers = [self.shards[0], *([self.standby] if self.standby is not None else [])]
        deadline = time.perf_counter() + seconds
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(min(POLL_SECONDS, left))
            replies = ray.get([a.poll.remote() for a in [self.shards[0], *receivers.values()]])
            for s, reply in zip(receivers, replies[1:]):
                if reply["recovery"] is not None:
                    for keeper in keepers:
                        keeper.trim.remote(s, reply["recovery"]["calls"])

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)


def measure_dana(
    workers: list[Any],
    servers: list[Any],
    d: int,
    warm: float,
    window: float,
    offsets: bool = False,
    copy: bool = False,
    relayed: RelayedServers | None = None,
) -> dict[str, float]:
    """Pushes per second at the servers (shard 0) over ``window`` seconds after ``warm``;
    with ``copy``, also one copy of the shard timed in the server right after the window,
    while the workers still push (the same load). ``relayed``: the servers of a run
    instead (``servers`` is ignored), the workers calling shard 0 only, the driver's work
    going on meanwhile."""
    wait, head = time.sleep, None
    if relayed is not None:
        servers, wait, head = relayed.shards, relayed.tend, relayed.names[0]
    ray.get([w.connect.remote(servers, d, i, 0, head) for i, w in enumerate(workers)])
    # (the workers push on past the window, up to a second, while the copy is timed)
    runs = [w.run_dana.remote(warm + window + min(1.0, window), offsets) for w in workers]
    wait(warm)
    t0, s0 = time.perf_counter(), ray.get(servers[0].stats.remote())
    wait(window)
    t1, s1 = time.perf_counter(), ray.get(servers[0].stats.remote())
    loaded_copy = ray.get(servers[0].copy_seconds.remote()) if copy else math.nan
    ray.get(runs)
    final = ray.get(servers[0].stats.remote())
    pushes = s1["pushes"] - s0["pushes"]
    return {
        "rate": pushes / (t1 - t0),
        "loaded_copy": loaded_copy,
        "handler": (s1["handler"] - s0["handler"]) / max(pushes, 1),
        "cpu": (s1["cpu"] - s0["cpu"]) / max(pushes, 1),
        "peak_anon_mb": final["peak_anon_mb"],
        "hwm_mb": final["hwm_mb"],
    }


def measure_example(workers: list[Any], server: Any, warm: float, window: float) -> float:
    """The example's asynchronous loop; apply_gradients per second over ``window``."""
    current_weights = server.get_weights.remote()
    gradients = {w.compute_gradients.remote(current_weights): w for w in workers}
    start = time.perf_counter()
    t0 = n0 = None
    applied = 0
    while True:
        now = time.perf_counter()
        if t0 is None and now - start >= warm:
            t0, n0 = now, applied
        if t0 is not None and now - t0 >= window:
            break
        ready_gradient_list, _ = ray.wait(list(gradients))
        ready_gradient_id = ready_gradient_list[0]
        worker = gradients.pop(ready_gradient_id)
        current_weights = server.apply_gradients.remote(*[ready_gradient_id])
        gradients[worker.compute_gradients.remote(current_weights)] = worker
        applied += 1
    ray.get(current_weights)
    ray.wait(list(gradients), num_returns=len(gradients))
    return (applied - n0) / (time.perf_counter() - t0)


def measure_standby(
    workers: list[Any], d: int, shard_counts: tuple[int, ...], warm: float, window: float
) -> dict[int, float]:
    """Pushes per second without and with shard 0's standby, at ``d`` with ``workers``,
    for each shard count; measured without, with, with, without. Per shard count, the
    ratio of the means (with / without)."""
    k = len(workers)
    ratios = {}
    for s in shard_counts:
        setups = {on: RelayedServers(d, k, s, standby=on) for on in (False, True)}
        for setup in setups.values():
            setup.start()
        rates: dict[bool, list[float]] = {False: [], True: []}
        for on in (False, True, True, False):
            rates[on].append(measure_dana(workers, [], d, warm, window, relayed=setups[on])["rate"])
        for setup in setups.values():
            setup.kill()
        ratios[s] = statistics.mean(rates[True]) / statistics.mean(rates[False])
        shown = {on: " and ".join(f"{r:.1f}" for r in rates[on]) for on in rates}
        print(
            f"standby S={s} d={d} k={k}: without {shown[False]} pushes/s, with "
            f"{shown[True]} pushes/s; with/without {ratios[s]:.2f}",
            flush=True,
        )
    return ratios


#: The codecs measured (``--compress``).
BENCH_CODECS = ("none", "fp16", "bf16", "int8", "topk:0.01")


def codec_seconds(spec: str, d: int, repeats: int) -> tuple[float, float]:
    """The median encode and decode times of one message of ``d`` float32 through codec
    ``spec``, here, on one thread (decoded into a buffer, as a shard does)."""
    codec = build_codec(spec)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(d, dtype=np.float32))
    out = torch.zeros(d)  # (a shard decodes into a buffer it keeps: so here)
    encode, decode = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        payload = codec.encode(x)
        middle = time.perf_counter()
        codec.decode(payload, out)
        encode.append(middle - start)
        decode.append(time.perf_counter() - middle)
    return statistics.median(encode), statistics.median(decode)


def measure_codecs(workers: list[Any], d: int, warm: float, window: float, repeats: int) -> str:
    """The codecs' rows at ``d`` with ``workers``, one shard; the summary line."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rates = {}
    (server,) = dana_servers(d, len(workers), 1)  # (one for every codec: it decodes any)
    for spec in BENCH_CODECS:
        encode, decode = codec_seconds(spec, d, repeats)
        nbytes = ray.get([w.encode.remote(spec, 1) for w in workers])[0]
        ours = measure_dana(workers, [server], d, warm, window)
        rates[spec] = ours["rate"]
        print(
            f"codec {spec:9s} d={d} k={len(workers)}: dana {ours['rate']:7.1f} pushes/s | "
            f"{nbytes:,} bytes a push ({nbytes / (4 * d):.3f} of float32) | encode "
            f"{1e3 * encode:8.1f} ms, decode {1e3 * decode:7.1f} ms (one thread) | server "
            f"handler {1e3 * ours['handler']:.1f} ms a push",
            flush=True,
        )
    ray.kill(server)
    ray.get([w.encode.remote("none", 1) for w in workers])
    torch.set_num_threads(threads)
    return "codecs pushes/s vs none: " + ", ".join(
        f"{spec} {rates[spec] / rates['none']:.2f}" for spec in BENCH_CODECS[1:]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run)")
    parser.add_argument("--window", type=float, default=None, help="seconds measured")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a smoke run: a tiny model, 1 and 2 workers, short windows; checks the script "
        "runs (its numbers mean nothing)",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="only the standby's rows (d = 272,474, 4 workers, 1 and 2 shards; about 2 "
        "minutes); the last line: with/without per shard count",
    )
    parser.add_argument(
        "--codecs",
        action="store_true",
        help="only the codecs' rows (d = 25,557,032, 4 workers, one shard; about a "
        "minute); the last line: each codec's pushes per second over none's",
    )
    args = parser.parse_args()
    window = args.window or (0.3 if args.smoke else 2.0 if args.quick else 5.0)
    warm = 0.2 if args.smoke else 1.0 if args.quick else 2.5
    shapes_of, large = (SMOKE_SHAPES, SMOKE) if args.smoke else (SHAPES, LARGE)
    counts = (1, 2) if args.smoke else (1, 2, 4, 8)
    shard_counts = (1, 2) if args.smoke else (1, 2, 4)
    memory_ks = (1, 2) if args.smoke else (1, 8)
    ratio_k = 2 if args.smoke else 4
    standby_d = SMOKE if args.smoke else SMALL
    ray.init(
        address="local",
        num_cpus=8 if args.smoke else 16,
        include_dashboard=False,
        object_store_memory=3 * 1024**3,
        logging_level=logging.ERROR,
        _system_config=local_system_config(),
    )
    print(f"{os.cpu_count()} CPU cores; warm-up {warm} s, window {window} s per measurement")
    if args.codecs:
        workers = [BenchWorker.remote(large, seed) for seed in range(ratio_k)]
        line = measure_codecs(workers, large, warm, window, 1 if args.smoke else 3)
        ray.shutdown()
        print(line)
        return
    if args.standby:
        workers = [BenchWorker.remote(standby_d, seed) for seed in range(ratio_k)]
        ratios = measure_standby(workers, standby_d, shard_counts[:2], warm, window)
        ray.shutdown()
        print("standby with/without " + ", ".join(f"S={s} {r:.2f}" for s, r in ratios.items()))
        return
    ratio_line = math.nan
    results: dict[tuple[int, int], tuple[float, float]] = {}
    for d, shapes_fn in shapes_of.items():
        shapes = shapes_fn()
        copy = copy_seconds(d)
        workers = [BenchWorker.remote(d, seed) for seed in range(max(counts))]
        ray.get([w.setup_example.remote(shapes) for w in workers])
        servers = dana_servers(d, max(counts), 1)
        example = ExampleServer.remote(shapes, 1e-3)
        print(f"\nd = {d:,}: one copy of d float32 in the driver, idle: {1e3 * copy:.3f} ms")
        for k in counts:
            ours = measure_dana(workers[:k], servers, d, warm, window, copy=True)
            theirs = measure_example(workers[:k], example, warm, window)
            results[(d, k)] = (ours["rate"], theirs)
            loaded = ours["loaded_copy"]
            print(
                f"d={d} k={k}: dana {ours['rate']:7.1f} pushes/s  ray example "
                f"{theirs:7.1f} pushes/s  ratio {ours['rate'] / theirs:5.2f} | dana server "
                f"per push: handler {1e3 * ours['handler']:.2f} ms, process CPU "
                f"{1e3 * ours['cpu']:.2f} ms, wall {1e3 / ours['rate']:.2f} ms | one copy in "
                f"the server under this load {1e3 * loaded:.2f} ms: handler "
                f"{ours['handler'] / loaded:.2f}, wall {1 / ours['rate'] / loaded:.2f} copies",
                flush=True,
            )
        for actor in servers + [example]:
            ray.kill(actor)
        if d == standby_d:
            print("")
            # (the smoke run: two shards only, the relay's every part at the least cost)
            standby_shards = (2,) if args.smoke else shard_counts[:2]
            measure_standby(workers[:ratio_k], d, standby_shards, warm, window)
        if d == large:
            print("")
            # (the smoke run: S = 1 at k = 2 is the measurement above, so two shards only)
            for s in (2,) if args.smoke else shard_counts:
                shards = dana_servers(d, len(workers), s)
                ours = measure_dana(workers, shards, d, warm, window)
                print(
                    f"servers S={s} d={d} k={len(workers)}: dana {ours['rate']:8.1f} pushes/s",
                    flush=True,
                )
                for actor in shards:
                    ray.kill(actor)
            print("")
            peaks = {}
            for k in memory_ks:
                (server,) = dana_servers(d, k, 1)
                ours = measure_dana(workers[:k], [server], d, warm, window, offsets=True)
                peaks[k] = ours["peak_anon_mb"]
                print(
                    f"memory dana-slim d={d} k={k}: server peak private (RssAnon) "
                    f"{ours['peak_anon_mb']:.1f} MB, peak resident (VmHWM, with object-store "
                    f"pages read) {ours['hwm_mb']:.1f} MB",
                    flush=True,
                )
                ray.kill(server)
            lo, hi = memory_ks
            print(f"memory growth k={lo} -> k={hi}: {100 * (peaks[hi] / peaks[lo] - 1):+.1f}%")
            print("")
            repeats = 1 if args.smoke else 3
            print(measure_codecs(workers[:ratio_k], d, warm, window, repeats), flush=True)
        for w in workers:
            ray.kill(w)
    ours, theirs = results[(large, ratio_k)]
    ratio_line = ours / theirs
    ray.shutdown()
    print(f"throughput vs ray example {ratio_line:.2f}")


if __name__ == "__main__":
    main()
