"""Where a Ray run runs: a private local Ray, or an existing cluster.

- No ``--address``: start a new single-node Ray for this command only
  (``ray.init(address="local")``, no dashboard), with as many logical CPUs as the run
  has actors (each server and worker reserves one, so that on a real cluster one
  worker takes one core), and shut it down at the end, whatever happens.
- ``--address ADDR`` (e.g. ``auto``, or ``HEAD_IP:6379`` from ``ray start --head``):
  join that cluster; it stays up afterwards.
- Ray already initialised in this process (a notebook, a test): use it as it is.

Actor placement: servers and workers use the ``SPREAD`` scheduling strategy, so on a
cluster the ``S`` server shards land on different nodes when there are several.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from dana.errors import DanaError

#: How often Ray restarts a worker that crashed before the run gives up on it.
WORKER_RESTARTS = 8


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
    """Connect to (or start) Ray for one run; shut down what this call started."""
    ray = import_ray()
    if ray.is_initialized():
        yield
        return
    options: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": True,
    }
    try:
        if address:
            _check_reachable(address)
            ray.init(address=address, **options)
        else:
            cpus = max(os.cpu_count() or 1, actors)
            ray.init(address="local", num_cpus=cpus, **options)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at --address {address}" if address else "a local Ray"
        raise DanaError(f"could not start or join {where}: {e}") from None
    try:
        yield
    finally:
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens at (Ray itself retries for minutes)."""
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local" or a form Ray interprets itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise DanaError(
            f"cannot reach the Ray cluster at --address {address}: {e.strerror or e}; "
            "start it with `ray start --head` (see docs/DISTRIBUTED.md)"
        ) from None


def server_options() -> dict[str, Any]:
    """A server shard: one CPU, spread over nodes, never restarted (a lost server ends
    the run; ``--resume`` continues from the last checkpoint)."""
    return {"num_cpus": 1, "scheduling_strategy": "SPREAD", "max_restarts": 0}


def worker_options() -> dict[str, Any]:
    """A worker: one CPU, spread over nodes, restarted after a crash."""
    return {
        "num_cpus": 1,
        "scheduling_strategy": "SPREAD",
        "max_restarts": WORKER_RESTARTS,
        "max_task_retries": 0,
    }
