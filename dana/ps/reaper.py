"""The reaper: a local Ray's processes die with the ``dana`` driver that started them.

A local Ray that ``dana train`` starts (:func:`dana.ps.cluster.ray_session`) runs its
GCS, node manager, agents and actors as the driver's descendants. Killed with SIGKILL,
the driver cannot shut them down; Ray's own watchdogs take from seconds (the actors)
to a minute (its agents), and some may be left. So the driver starts this small
process (:func:`start`), in a session of its own (a kill of the driver's process
group misses it), with a pipe from the driver as its standard input. The rule:

- while the pipe is open it notes, every :data:`LOOK_SECONDS`, the driver's
  descendants whose command line names Ray (``ray``: ``gcs_server``, ``raylet``,
  ``ray::...``, Ray's Python workers and agents), with their start times;
- when the pipe closes (the driver exited or was killed: the kernel closes its end),
  it SIGKILLs every process it noted that still runs (the same pid *and* start time:
  never a newcomer that reused a pid), and exits.

A driver that ends normally closes the pipe after ``ray.shutdown()``, which has
stopped the node; the reaper then only ends what Ray left behind.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

#: Seconds between two looks at the driver's descendants.
LOOK_SECONDS = 0.5


def start() -> IO[bytes] | None:
    """Start the reaper of this process's Ray processes; the write end of its pipe (keep
    it open for as long as Ray runs, close it after ``ray.shutdown()``). None where
    there is no ``/proc`` (not Linux)."""
    if not Path("/proc/self/stat").exists():
        return None
    proc = subprocess.Popen(
        [sys.executable, "-m", "dana.ps.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return proc.stdin


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of ``pid``, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def ray_descendants(root: int, me: int) -> dict[int, int]:
    """The descendants of ``root`` whose command line names Ray (not ``me``): pid ->
    start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
                starts[int(entry)] = stat[1]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == me:
            continue
        todo.extend(children.get(pid, []))
        if "ray" in _command(pid).lower():
            found[pid] = starts[pid]
    return found


def reap(noted: dict[int, int]) -> int:
    """SIGKILL every noted process still running as itself; how many."""
    killed = 0
    for pid, started in noted.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def main(driver: int) -> None:
    me = os.getpid()
    noted: dict[int, int] = {}
    stdin = sys.stdin.buffer.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], LOOK_SECONDS)
        if ready and not os.read(stdin, 4096):
            break  # the pipe closed: the driver is gone (or done)
        noted.update(ray_descendants(driver, me))
    reap(noted)


if __name__ == "__main__":
    main(int(sys.argv[1]))
