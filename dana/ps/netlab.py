"""A Ray cluster of real, bandwidth-limited links on one machine, for tests and studies.

:class:`NetLab` starts one Ray node per network namespace: the head (the driver and the
server shards) and worker nodes, each namespace joined to a bridge (in a namespace of its
own) by a veth pair. Each worker node's link is shaped in both directions with
``tc qdisc ... tbf`` (a token bucket: ``rate``, a burst of a few ms, a queue of
:data:`QUEUE_MS`); the head's is not. ``netem`` is not used, so links have no added
latency. Addresses are private (``10.231.0.0/24``) and exist only inside the namespaces
it creates; the namespaces' names are unique per lab (``dnl`` and 6 random hex
digits), so labs in parallel do not collide. Everything is torn down on leaving the
context, also after an error: every process in each namespace (``ip netns pids``) is
killed, the namespaces are deleted (their veths with them), the temporary folder removed.
Needs root and ``ip netns`` (:func:`unavailable` says why not).

Placement: ``dana train --address`` puts shard 0 on the driver's node and spreads the
other actors, so nothing in the runtime pins a worker to a node. :meth:`NetLab.train`
does it from outside, with the runtime as it is: each worker node has one CPU per worker
it should host (``Node.cpus``) and the head one per server actor; before the driver
starts, a *holder* (``python -m dana.ps.netlab hold``) reserves every worker node's CPUs
in placement groups, so the servers can only start on the head; once the head's CPUs are
taken it releases them, and the workers, waiting for CPUs, start on the worker nodes.
``dist.json``'s ``placement`` records where each actor ran (:meth:`NetLab.nodes_of`).

Command line (what the lab runs inside its namespaces)::

    python -m dana.ps.netlab hold ADDRESS NODE:CPUS [NODE:CPUS ...]
    python -m dana.ps.netlab sink PORT           # counts bytes until EOF, answers the count
    python -m dana.ps.netlab send HOST PORT BYTES   # prints bytes/s, end to end
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The lab's subnet (private addresses on its veths only); the head is ``.1``.
SUBNET = "10.231.0"
#: The head's GCS port (each namespace has its own ports).
GCS_PORT = 6379
#: The tbf queue, in ms of the link's rate: a longer queue delays the calls queued
#: behind a transfer.
QUEUE_MS = 50
#: Seconds any one ``ip``/``tc`` command, ``ray start``, or the holder's wait may take.
COMMAND_SECONDS = 120.0
#: Times each node's ``ray start`` is tried.
START_ATTEMPTS = 3
#: Object store per node (bytes): the runs' messages are a few MB.
OBJECT_STORE_BYTES = 200 * 1024**2
#: The custom resource that names a worker node: ``netlab_<node name>``.
RESOURCE_PREFIX = "netlab_"


@dataclass(frozen=True)
class Node:
    """A worker node: its name (letters, digits), its link's rate in Mbit/s each way
    (None: not shaped) and the workers (CPUs) it hosts."""

    name: str
    mbit: float | None
    cpus: int = 1

    def __post_init__(self) -> None:
        if not (self.name.isalnum() and self.name != "head"):
            raise ValueError(f"a node's name is letters and digits, not 'head': {self.name!r}")
        if self.mbit is not None and not self.mbit > 0:
            raise ValueError(f"node {self.name}: a link's rate is > 0 Mbit/s, not {self.mbit}")
        if self.cpus < 1:
            raise ValueError(f"node {self.name}: at least 1 CPU, not {self.cpus}")


def unavailable() -> str | None:
    """Why a lab cannot start here (not root, no ``ip``/``tc``, no ``ip netns``, no
    Ray), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command (iproute2)"
    probe = f"dnlprobe{os.urandom(3).hex()}"  # (a namespace, veth and tbf of its own)
    steps = (
        ["ip", "netns", "add", probe],
        ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
        ["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", *tbf_args(10)],
    )
    try:
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_SECONDS)
            if done.returncode != 0:
                return f"`{' '.join(argv[:3])} ...` fails here: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=COMMAND_SECONDS)
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs Ray: pip install 'ray>=2.9'"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (bounded by :data:`COMMAND_SECONDS`); RuntimeError naming it and its
    stderr when it fails and ``check``."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_SECONDS)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done


def tbf_args(mbit: float) -> list[str]:
    """``tc qdisc ... tbf`` arguments for a link of ``mbit`` Mbit/s: a burst of 2 ms of
    the rate (at least 16 KB, so that a full frame always fits), a queue of
    :data:`QUEUE_MS`.

    >>> tbf_args(100)
    ['tbf', 'rate', '100mbit', 'burst', '25000', 'latency', '50ms']
    """
    burst = max(16384, round(mbit * 1e6 / 8 * 0.002))
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", f"{QUEUE_MS}ms"]


class NetLab:
    """Ray nodes in network namespaces, joined by shaped veth links (a context manager).

    Args:
        nodes: the worker nodes (distinct names of letters and digits).
        head_cpus: the head's CPUs: one per server actor (``S``, plus 1 for the standby)
            for :meth:`train`'s placement.
        env: extra environment for the Ray nodes and commands run in the lab.
    """

    def __init__(self, nodes: Sequence[Node], head_cpus: int, env: dict[str, str] | None = None):
        names = [n.name for n in nodes]
        if len(set(names)) != len(names) or len(nodes) > 200:
            raise ValueError(f"at most 200 worker nodes, of distinct names: {names}")
        self.nodes = list(nodes)
        self.head_cpus = head_cpus
        self.tag = "dnl" + secrets.token_hex(3)
        self.ip = {"head": f"{SUBNET}.1"} | {
            n.name: f"{SUBNET}.{10 + i}" for i, n in enumerate(nodes)
        }
        self.address = f"{self.ip['head']}:{GCS_PORT}"
        self.temp: Path | None = None
        self.namespaces: list[str] = []
        self.extra_env = dict(env or {})

    # -- names -------------------------------------------------------------------------
    def netns(self, node: str) -> str:
        """The namespace of ``node`` (``"head"`` or a worker node's name)."""
        return f"{self.tag}-{node}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of everything run in the lab: no ``RAY_`` settings of the
        caller's, a home of its own (no Ray token: no authentication), one thread."""
        assert self.temp is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HOME=str(self.temp / "home"), OMP_NUM_THREADS="1", RAY_worker_niceness="0")
        return env | self.extra_env

    # -- the context -------------------------------------------------------------------
    def __enter__(self) -> NetLab:
        why = unavailable()
        if why:
            raise RuntimeError(f"cannot start a network lab: {why}")
        self.temp = Path(tempfile.mkdtemp(prefix=f"/tmp/{self.tag}-"))  # short: Ray's sockets
        (self.temp / "home").mkdir()
        try:
            self._links()
            self._ray()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_netns(self, node: str) -> str:
        name = self.netns(node)
        _sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _links(self) -> None:
        """The bridge's namespace, and each node's namespace joined to it by a veth pair
        (``eth0`` in the node, ``vN`` on the bridge), shaped both ways where a rate is
        given."""
        bridge = self._add_netns("br")
        _sh("ip", "-n", bridge, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", bridge, "link", "set", "br0", "up")
        for i, (name, mbit) in enumerate([("head", None), *((n.name, n.mbit) for n in self.nodes)]):
            ns, port = self._add_netns(name), f"v{i}"
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", bridge)  # fmt: skip
            _sh("ip", "-n", bridge, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            if mbit is not None:  # uploads leave eth0, downloads leave the bridge's port
                _sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *tbf_args(mbit))
                _sh("tc", "-n", bridge, "qdisc", "add", "dev", port, "root", *tbf_args(mbit))

    def _ray_start(self, node: str, *args: str) -> subprocess.Popen:
        assert self.temp is not None
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", *args,
                "--node-ip-address", self.ip[node], "--temp-dir", str(self.temp),
                "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats"]  # fmt: skip
        return self.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def _ray(self) -> None:
        """``ray start`` on the head, then on each worker node in turn (with its custom
        resource ``netlab_<name>``), each tried :data:`START_ATTEMPTS` times (a raylet
        misses its 30 s to register on a busy machine); RuntimeError with Ray's output."""
        self._start_node("head", "--head", "--port", str(GCS_PORT), "--num-cpus",
                         str(self.head_cpus), "--include-dashboard", "false")  # fmt: skip
        for n in self.nodes:
            resource = json.dumps({RESOURCE_PREFIX + n.name: 1})
            self._start_node(n.name, "--address", self.address, "--num-cpus", str(n.cpus),
                             "--resources", resource)  # fmt: skip

    def _start_node(self, node: str, *args: str) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            process = self._ray_start(node, *args)
            try:
                out, _ = process.communicate(timeout=COMMAND_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                out, _ = process.communicate()
            if process.returncode == 0:
                return
            _kill_netns(self.netns(node))  # what the failed start left
            if attempt == START_ATTEMPTS:
                raise RuntimeError(f"`ray start` on {node} failed: {out.decode()[-2000:]}")

    def close(self) -> None:
        """Kill every process in the lab's namespaces (SIGTERM, then SIGKILL after 5 s),
        delete the namespaces and the temporary folder. Safe to call twice."""
        for ns in self.namespaces:
            _kill_netns(ns)
        for ns in reversed(self.namespaces):
            _sh("ip", "netns", "del", ns, check=False)
        self.namespaces = []
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)
            self.temp = None

    # -- running things in the lab -----------------------------------------------------
    def popen(self, node: str, argv: Sequence[str], **options: Any) -> subprocess.Popen:
        """Start ``argv`` in ``node``'s namespace, with the lab's environment."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns(node), *argv],
                                env=self.env, **options)  # fmt: skip

    def run(self, node: str, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``node``'s namespace to its end (text output captured); killed
        after ``timeout`` s (then TimeoutExpired)."""
        process = self.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(argv, process.returncode, out, err)

    def throughput(self, sender: str, receiver: str, nbytes: int, timeout: float = 60.0) -> float:
        """Bytes per second of one TCP transfer of ``nbytes`` from ``sender``'s node to
        ``receiver``'s, end to end (connect to the receiver's count of the last byte)."""
        module = [sys.executable, "-m", "dana.ps.netlab"]
        port = 5201
        sink = self.popen(receiver, [*module, "sink", str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout is not None
            if sink.stdout.readline().strip() != "listening":
                raise RuntimeError(f"the sink in {receiver} did not start")
            sent = self.run(sender, [*module, "send", self.ip[receiver], str(port), str(nbytes)],
                            timeout)  # fmt: skip
            if sent.returncode != 0:
                raise RuntimeError(f"the transfer failed: {sent.stderr[-2000:]}")
            return float(sent.stdout.split()[-1])
        finally:
            sink.kill()
            sink.communicate()

    def train(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
        """Run ``dana train ARGV --backend ray --address HEAD`` on the head, its workers
        placed on the worker nodes (the holder: see the module's docstring); text output
        captured. RuntimeError if the holder cannot reserve the nodes."""
        module = [sys.executable, "-m", "dana.ps.netlab", "hold", self.address]
        held = [f"{n.name}:{n.cpus}" for n in self.nodes]
        holder = self.popen("head", [*module, *held], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline().strip()
            if line != "held":
                raise RuntimeError(f"the holder could not reserve the worker nodes: {line!r}")
            train = [sys.executable, "-m", "dana.cli", "train", *argv, "--backend", "ray",
                     "--address", self.address]  # fmt: skip
            return self.run("head", train, timeout)
        finally:
            holder.kill()
            holder.communicate()

    def nodes_of(self, run_dir: str | Path) -> dict[str, str]:
        """Where each actor of a run ran (``dist.json``'s ``placement``): actor -> node
        name (``head`` or a worker node's)."""
        by_ip = {ip: node for node, ip in self.ip.items()}
        placement = json.loads((Path(run_dir) / "dist.json").read_text())["placement"]
        return {actor: by_ip.get(where["ip"], where["ip"]) for actor, where in placement.items()}


def _kill_netns(ns: str) -> None:
    """SIGTERM every process in namespace ``ns``, SIGKILL those left after 5 s; bounded."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        pids = _netns_pids(ns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + wait
        while pids and time.time() < deadline:
            time.sleep(0.1)
            pids = _netns_pids(ns)
        if not pids:
            return


def _netns_pids(ns: str) -> list[int]:
    done = _sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]


# -- what runs inside the namespaces ------------------------------------------------------
def _hold(address: str, nodes: list[str], wait: float = COMMAND_SECONDS) -> int:
    """Reserve each ``NAME:CPUS`` worker node's CPUs (a placement group pinned by its
    resource), say ``held``; release them once the cluster has no free CPU left (the
    server actors have taken the head's) or after ``wait`` s."""
    import logging

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    groups = []
    for spec in nodes:
        name, cpus = spec.split(":")
        bundle = {"CPU": float(cpus), RESOURCE_PREFIX + name: 1.0}
        groups.append(placement_group([bundle], strategy="STRICT_PACK"))
    try:
        ray.get([g.ready() for g in groups], timeout=wait)
    except Exception as e:  # (a GetTimeoutError, or the cluster lost)
        print(f"not held: {e}", flush=True)
        return 1
    print("held", flush=True)
    deadline = time.time() + wait
    while time.time() < deadline and ray.available_resources().get("CPU", 0.0) > 1e-6:
        time.sleep(0.1)
    for g in groups:
        remove_placement_group(g)
    ray.shutdown()
    return 0


def _sink(port: int) -> int:
    """Accept one connection, count its bytes to EOF, answer the count."""
    with socket.create_server(("0.0.0.0", port)) as server:
        print("listening", flush=True)
        server.settimeout(COMMAND_SECONDS)
        link, _ = server.accept()
        with link:
            total = 0
            while chunk := link.recv(1 << 16):
                total += len(chunk)
            link.sendall(f"{total}\n".encode())
    return 0


def _send(host: str, port: int, nbytes: int) -> int:
    """Send ``nbytes`` zeros, wait for the count; print the bytes per second."""
    block = bytes(1 << 16)
    start = time.perf_counter()
    with socket.create_connection((host, port), timeout=COMMAND_SECONDS) as link:
        left = nbytes
        while left > 0:
            left -= link.send(block[: min(left, len(block))])
        link.shutdown(socket.SHUT_WR)
        answer = link.makefile().readline()
    seconds = time.perf_counter() - start
    if int(answer) != nbytes:
        print(f"sent {nbytes} bytes, the sink counted {answer.strip()}", file=sys.stderr)
        return 1
    print(f"{nbytes / seconds:.1f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dana.ps.netlab", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    hold = commands.add_parser("hold")
    hold.add_argument("address")
    hold.add_argument("nodes", nargs="+", help="NAME:CPUS")
    sink = commands.add_parser("sink")
    sink.add_argument("port", type=int)
    send = commands.add_parser("send")
    send.add_argument("host")
    send.add_argument("port", type=int)
    send.add_argument("nbytes", type=int)
    args = parser.parse_args(argv)
    if args.command == "hold":
        return _hold(args.address, args.nodes)
    if args.command == "sink":
        return _sink(args.port)
    return _send(args.host, args.port, args.nbytes)


if __name__ == "__main__":
    sys.exit(main())
