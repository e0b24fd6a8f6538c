"""Where a Ray run runs: a private local Ray, or an existing cluster.

- No ``--address``: start a new single-node Ray for this command only
  (``ray.init(address="local")``, no dashboard), with as many logical CPUs as the run
  has actors (each server and worker reserves one, so that on a real cluster one
  worker takes one core), bound to the loopback interface only (:func:`_loopback`),
  its actors at the driver's own priority (:func:`local_system_config`), and shut it
  down at the end, whatever happens; a reaper (:mod:`dana.ps.reaper`) kills its
  processes within a second of the driver's death, even by SIGKILL.
- ``--address ADDR`` (e.g. ``auto``, or ``HEAD_IP:6379`` from ``ray start --head``):
  join that cluster; it stays up afterwards. A cluster that requires Ray's token
  authentication is detected before joining (:mod:`dana.ps.auth`).
- Ray already initialised in this process (a notebook, a test): use it as it is.

CPUs: every actor asks for one logical CPU. When the cluster has fewer than the run has
actors, :func:`cpus_per_actor` gives each the largest fraction ``1/m`` that lets all of
them be placed (they then share cores; a warning says so), instead of leaving the ones
that do not fit pending for ever.

Actor placement: servers and workers use the ``SPREAD`` scheduling strategy, so on a
cluster the ``S`` server shards land on different nodes when there are several.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from dana.errors import ConfigError, DanaError
from dana.train.records import preempt

#: How often Ray restarts a worker that crashed before the run gives up on it.
WORKER_RESTARTS = 8

#: Seconds the actors have to start (build their problem) before the run gives up.
READY_SECONDS = 300.0


class ServerLost(Exception):
    """A server actor is gone: its process or node, or a reply it owned or stored
    (:meth:`dana.ps.group.ShardGroup.reply`)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DanaError(
            "--backend ray needs Ray: pip install 'ray>=2.9' (or pip install -e '.[ray]')"
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None, actors: int) -> Iterator[None]:
    """Connect to (or start) Ray for one run; shut down what this call started. A Ray
    this process has initialised already is used as it is; a cluster ``address`` other
    than the one it is connected to is refused (DanaError). The process's SIGTERM
    handler (a run's preemption, :mod:`dana.train.records.preempt`) stays in place while
    Ray starts (:func:`_own_sigterm`); a local Ray is not started again after a signal,
    so the caller, who looks at ``preempt.requested()`` first, stops the run at once."""
    ray = import_ray()
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        named = address and address != "auto" and not address.startswith("ray://")
        if named and address != current:
            raise DanaError(
                f"Ray is already initialised in this process, connected to {current}, "
                f"not to --address {address}: call ray.shutdown() first, or leave the "
                "address out to run on the Ray connected already"
            )
        yield
        return
    options: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": True,
    }
    from dana.ps import reaper

    pipe = None if address else reaper.start()  # (a cluster's processes are not ours)
    try:
        if address:
            _check_reachable(address)
            from dana.ps.auth import check_token

            check_token(address)
            _join(ray, address, options)
        else:
            _start_local(ray, max(os.cpu_count() or 1, actors), options)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
        if pipe is not None:
            pipe.close()
        where = f"the Ray cluster at --address {address}" if address else "a local Ray"
        raise DanaError(f"could not start or join {where}: {e}") from None
    try:
        yield
    finally:
        ray.shutdown()
        if pipe is not None:
            pipe.close()  # the reaper ends what Ray left behind


def _join(ray: Any, address: str, options: dict[str, Any]) -> None:
    """``ray.init`` of the cluster at ``address``, given up after :func:`connect_timeout`
    (Ray itself retries for minutes where a GCS answers and the rest does not): then
    DanaError naming the address, this process's Ray shut down again. The deadline is a
    timer (SIGALRM) in the main thread only; elsewhere Ray's own retries bound it."""
    timeout = connect_timeout()

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    timed = threading.current_thread() is threading.main_thread()
    if timed:
        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with _own_sigterm(ray):
            ray.init(address=address, **options)
    except TimeoutError:
        ray.shutdown()
        raise DanaError(
            f"could not join the Ray cluster at --address {address}: Ray did not connect "
            f"within {timeout:g} s ({CONNECT_TIMEOUT_VAR} sets the deadline); check that it "
            "is the address `ray start --head` printed and that this machine reaches the "
            "cluster's nodes (see docs/DISTRIBUTED.md)"
        ) from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


#: Times a local Ray is started before the run gives up (Ray gives its node manager 30 s
#: to register, which a machine under a heavy load can miss).
START_ATTEMPTS = 3


def _start_local(ray: Any, cpus: int, options: dict[str, Any]) -> None:
    """``ray.init`` of a new local Ray; a node that timed out during startup is shut down
    and started again (:data:`START_ATTEMPTS` in all), then RuntimeError."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            with _loopback(ray), _own_sigterm(ray):
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    _node_ip_address=LOOPBACK,
                    _system_config=local_system_config(),
                    **options,
                )
            return
        except Exception as e:  # (Ray raises a bare Exception for this one)
            if "timed out during startup" not in str(e):
                raise
            ray.shutdown()
            if preempt.requested():
                return  # (no Ray: the caller stops the run)
            if attempt == START_ATTEMPTS:
                raise RuntimeError(
                    f"its node did not start in {START_ATTEMPTS} attempts ({e}); the machine "
                    "may be overloaded: try again when it is less busy"
                ) from None


def local_system_config() -> dict[str, Any]:
    """Ray settings for a local Ray that this command starts itself.

    Ray starts its worker processes, and so every actor, at nice 15 (its
    ``worker_niceness``), so that on a cluster node they yield to Ray's own services.
    Started by ``dana train`` the actors are the run itself: at nice 15 any other work on
    the machine takes the cores first and the run starves (measured: minutes to start
    beside two single-threaded jobs on two cores). Here they run at the driver's
    priority. A ``RAY_worker_niceness`` in the environment is the user's choice and is
    kept (Ray's system config would override it).
    """
    return {} if "RAY_worker_niceness" in os.environ else {"worker_niceness": 0}


@contextlib.contextmanager
def _own_sigterm(ray: Any) -> Iterator[None]:
    """Keep the process's SIGTERM handler while ``ray.init`` runs.

    Ray (2.60) installs its own as ``ray.init`` begins, which exits at once
    (``sys.exit(15)``: status 15, no message, the run directory as it was); a signal
    while Ray starts would never reach dana's (:mod:`dana.train.records.preempt`: a
    message and status 75). Ray's installer is a no-op meanwhile; if it is gone in another
    Ray version, nothing is changed (the driver installs dana's again after ``ray.init``).
    """
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    if utils is None or not hasattr(utils, "set_sigterm_handler"):
        yield
        return
    before = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = before


#: The address a local Ray binds to and advertises.
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _loopback(ray: Any) -> Iterator[None]:
    """Make a new local Ray keep ``_node_ip_address="127.0.0.1"``.

    Ray (2.60) rewrites a loopback node address to the machine's outward address unless
    it believes clusters are off (its ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` switch, read
    once at import); then every server of the node (GCS, raylet, object manager, the
    workers' gRPC ports, the agents) binds to the address given. Turned off only while
    ``ray.init`` starts the node, so joining a cluster later in this process is
    unaffected. If the switch is gone in another Ray version, nothing is changed.
    """
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is None or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


def cpus_per_actor(node_cpus: list[float], actors: int) -> float:
    """The logical CPUs each of ``actors`` actors asks for, so that all can be placed on
    nodes with ``node_cpus`` CPUs each: 1, or the largest ``1/m`` with
    ``sum(floor(c * m)) >= actors``.

    >>> cpus_per_actor([8.0], 5), cpus_per_actor([2.0], 5), cpus_per_actor([1.0, 1.0], 3)
    (1.0, 0.3333333333333333, 0.5)
    """
    if sum(math.floor(c + 1e-9) for c in node_cpus) >= actors:
        return 1.0
    if not any(c > 0 for c in node_cpus):
        raise DanaError(
            "the Ray cluster has no CPUs for the run's actors; start its nodes with "
            "`ray start --num-cpus N` (N >= 1)"
        )
    m = 2
    while sum(math.floor(c * m + 1e-9) for c in node_cpus) < actors:
        m += 1
    return 1.0 / m


def placement(ray: Any, actors: int) -> float:
    """:func:`cpus_per_actor` for the live nodes of the connected cluster; warns on
    stderr when the actors must share CPUs."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = [float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes]
    share = cpus_per_actor(node_cpus, actors)
    if share < 1.0:
        print(
            f"dana: the Ray cluster has {sum(node_cpus):g} CPUs for the run's {actors} "
            f"actors (workers and server shards): each gets {share:.3g} CPU and they "
            "share cores; add CPUs (`ray start --num-cpus`) or fewer --workers for one "
            "core each",
            file=sys.stderr,
        )
    return share


#: Seconds to wait for the cluster at ``--address`` to answer; the environment
#: variable :data:`CONNECT_TIMEOUT_VAR` sets another.
CONNECT_TIMEOUT = 30.0
CONNECT_TIMEOUT_VAR = "DANA_CONNECT_TIMEOUT"


def connect_timeout() -> float:
    """The seconds to wait for a cluster to answer (:data:`CONNECT_TIMEOUT`, or the
    environment's ``DANA_CONNECT_TIMEOUT``); ConfigError for a value that is no number
    of seconds in (0, 3600]."""
    text = os.environ.get(CONNECT_TIMEOUT_VAR)
    if text is None:
        return CONNECT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise ConfigError(
            f"{CONNECT_TIMEOUT_VAR}={text!r}: give the seconds to wait for the Ray cluster, "
            "a number in (0, 3600]"
        )
    return value


def _check_reachable(address: str) -> None:
    """Fail within :func:`connect_timeout` on a ``HOST:PORT`` nobody listens at, or that
    does not answer (Ray itself retries for minutes)."""
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local" or a form Ray interprets itself
    timeout = connect_timeout()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as link:
            speaks_grpc = _answers_http2(link)
    except OSError as e:
        problem = (
            f"no answer within {timeout:g} s ({CONNECT_TIMEOUT_VAR} sets the deadline)"
            if isinstance(e, TimeoutError | socket.timeout)
            else e.strerror or str(e)
        )
        raise DanaError(
            f"cannot reach the Ray cluster at --address {address}: {problem}; start it "
            "with `ray start --head` on that machine, or check the address (see "
            "docs/DISTRIBUTED.md)"
        ) from None
    from dana.ps.auth import probe

    if not speaks_grpc or probe(f"{host}:{port}", None) == "no-gcs":
        why = "does not answer HTTP/2" if not speaks_grpc else "has no GCS service"
        raise DanaError(
            f"--address {address}: what listens there is not a Ray cluster (its GCS speaks "
            f"gRPC, and this {why}); give the address `ray start --head` printed (its "
            "--port, 6379 by default)"
        )


#: HTTP/2's connection preface and an empty SETTINGS frame: a gRPC server (a Ray GCS)
#: answers with a SETTINGS frame of its own.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x04


def _answers_http2(link: socket.socket) -> bool:
    """Whether the server at ``link`` answers HTTP/2's preface with a frame header whose
    type is SETTINGS (within the socket's timeout; silence or another protocol: no)."""
    try:
        link.sendall(_HTTP2_HELLO)
        header = b""
        while len(header) < 9:
            chunk = link.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:
        return False
    return header[3] == _SETTINGS


def server_options(cpus: float = 1.0) -> dict[str, Any]:
    """A server shard: ``cpus`` CPUs, spread over nodes, never restarted by Ray (a new
    process would have lost the shard's state): the driver rebuilds a lost shard
    ``s >= 1`` itself (:mod:`dana.ps.recovery`); a lost shard 0 ends the run."""
    return {"num_cpus": cpus, "scheduling_strategy": "SPREAD", "max_restarts": 0}


def worker_gpus(ray: Any, device: str, workers: int) -> float:
    """GPUs per worker: with ``--device cuda`` (or ``auto``) on a cluster that has GPUs,
    an equal share of them (at most one each), else 0. The servers take none."""
    if device == "cpu":
        return 0.0
    total = float(ray.cluster_resources().get("GPU", 0.0))
    return min(1.0, total / workers) if total > 0 else 0.0


def worker_options(cpus: float = 1.0, gpus: float = 0.0) -> dict[str, Any]:
    """A worker: ``cpus`` CPUs (and ``gpus`` GPUs), spread over nodes, restarted after a
    crash."""
    return {
        **({"num_gpus": gpus} if gpus > 0 else {}),
        "num_cpus": cpus,
        "scheduling_strategy": "SPREAD",
        "max_restarts": WORKER_RESTARTS,
        "max_task_retries": 0,
    }


def node_of() -> dict[str, str]:
    """The node this process (an actor) runs on: its IP address and Ray node id."""
    import ray

    context = ray.get_runtime_context()
    return {"ip": ray.util.get_node_ip_address(), "node": context.get_node_id()}
