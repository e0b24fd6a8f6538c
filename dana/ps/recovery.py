"""Rebuilding a lost server shard, or shard 0's standby, while the run goes on.

Shard 0 (the head) orders the run: once it has applied a push or served a pull, it
makes the same call on its **standby** (a replica of shard 0, waiting for it to answer)
and then on every other shard (:mod:`dana.ps.head`, :mod:`dana.ps.relay`). Every
call it passes on is numbered ``1, 2, 3, ...``; each receiver runs a call only if its
number is the next one it expects (:meth:`~dana.ps.shard.ShardServer.relayed`: a
repeat is skipped), so a call sent twice (a replay, a promotion) runs once. The order
is the whole input of a receiver: its state is a deterministic function of the calls
it ran. So:

- **the log** (:class:`RelayLog`, kept by the head and, identically, by the standby):
  every call passed on, with its arguments for every shard (``args[0]``: shard 0's own,
  for the standby; a push's slices copied, so that they outlive their worker), from the
  oldest snapshot the driver holds on;
- **the snapshots** (:meth:`~dana.ps.shard.ShardServer.recovery_state`, which a new
  server loads whole, :meth:`~dana.ps.shard.ShardServer.load_recovery`, each of its
  parts restoring its own state): the standby and each shard ``s >= 1`` count the
  calls they have run, and every :data:`SNAPSHOT_SECONDS` their ``poll`` reply carries
  their whole state with that count. The driver keeps the latest one of
  each (in its own process) and tells the head and the standby to drop the calls every
  snapshot covers (:meth:`RelayLog.trim`);
- **a lost shard ``s >= 1``**: a new actor from its latest snapshot (before the first
  one, from the shard's starting arguments), and the head sends it every logged call
  after the snapshot's count (:meth:`RelayLog.replay`), then passes calls on to it;
- **a lost standby**: the same, from the standby's snapshot; the head sends it the whole
  log (it logs every entry and runs those past its count), then waits for it again;
- **a lost head**: the standby has run every call the head passed on to anyone (it
  answered before the head went on), so it is promoted: it passes its log on to the
  other shards (each skips what it has) and becomes the head; the workers send their
  unanswered calls again to it, with the same sequence numbers (a push it has already
  applied is answered ``duplicate``); then a new standby is built from the latest
  standby snapshot and the new head's log. A head taken for lost that was only slow
  (no reply within ``--server-timeout``) may run on until the driver's kill lands: its
  promoted standby refuses its calls, so it passes nothing more on to anyone (it is
  **deposed**: it answers its workers ``"not-head"``, and they find the new head).

Losing the head and its standby at once (or the driver) is not survived: the run ends
with :class:`~dana.errors.FaultError` (exit status 4) and ``--resume`` continues from the
last checkpoint.
"""

from __future__ import annotations

import errno
import pickle
import tempfile
from collections import deque
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

from dana.errors import WriteError
from dana.ps.protocol import Entry, Method, Pull, Push

#: Seconds between two snapshots of a shard ``s >= 1`` (or the standby) for its recovery.
SNAPSHOT_SECONDS = 1.0

#: The default bound on the bytes a relay log holds in memory (``--relay-log-bytes``).
RELAY_LOG_BYTES = 2 * 1024**3

#: The most bytes of logged calls sent to a new standby in one call (:meth:`RelayLog.chunks`).
CHUNK_BYTES = 256 * 1024**2


#: The least and the most bytes of spilled calls per spill file (a segment): the memory
#: bound, within these (:class:`SpillFiles`).
SEGMENT_BYTES = (16 * 1024**2, CHUNK_BYTES)

#: A spill write's errors that mean the disk (or the user's quota) is full.
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class Segment:
    """One spill file: an anonymous temporary file (deleted by the system once closed, or
    when the process ends, however it ends), its size, and its calls still logged."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="dana-relay-log-")
        self.size = 0
        self.live = 0


class Spilled(NamedTuple):
    """A logged call kept on disk: its number, and where its pickle lies."""

    number: int
    segment: Segment
    offset: int
    length: int


class SpillFiles:
    """The calls a :class:`RelayLog` keeps on disk, written in order into segments of
    about ``segment`` bytes (one call at least). A segment is closed, its disk space
    freed, once every call in it is trimmed; the log is trimmed oldest first, so only
    the oldest segment holds trimmed calls: the disk never holds more than the spilled
    calls still logged plus one segment (and one call).

    A full disk (``ENOSPC``, ``EDQUOT``) on a write raises
    :class:`~dana.errors.WriteError`, naming the directory and the fixes; nothing is
    written (:meth:`RelayLog.add` keeps the call in memory instead).
    """

    def __init__(self, segment: int):
        self.segment = segment
        self.segments: deque[Segment] = deque()  # oldest first; the last one written to
        self.calls = self.bytes = 0  # on disk now (bytes: trimmed calls not freed yet too)
        self.total_calls = self.peak_bytes = 0  # ever spilled; the most on disk at once

    def put(self, entry: Entry) -> Spilled:
        """Write ``entry`` at the end of the newest segment (a new one once it is full)."""
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            if not self.segments or self.segments[-1].size >= self.segment:
                self.segments.append(Segment())
            seg = self.segments[-1]
            seg.file.seek(seg.size)
            seg.file.write(data)
            seg.file.flush()  # (a full disk fails here, not at a later read)
        except OSError as e:
            if e.errno in _FULL:
                raise WriteError(self._full_message()) from e
            raise
        item = Spilled(entry.number, seg, seg.size, len(data))
        seg.size += len(data)
        seg.live += 1
        self.calls += 1
        self.total_calls += 1
        self.bytes += len(data)
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return item

    def get(self, item: Spilled) -> Entry:
        """The call ``item`` read back from disk."""
        item.segment.file.seek(item.offset)
        return pickle.loads(item.segment.file.read(item.length))

    def drop(self, item: Spilled) -> None:
        """``item`` is trimmed from the log: close the oldest segments left with no call."""
        item.segment.live -= 1
        self.calls -= 1
        while self.segments and not self.segments[0].live:  # (at most every segment)
            seg = self.segments.popleft()
            seg.file.close()
            self.bytes -= seg.size

    def _full_message(self) -> str:
        return (
            f"no space left on the disk of {tempfile.gettempdir()} for shard 0's relay log "
            f"({self.calls} calls, {self.bytes / 1024**2:,.0f} MiB spilled there now, past "
            "its memory bound): free space there, raise --relay-log-bytes to keep more of "
            "the log in memory, or set TMPDIR to a directory on a larger disk"
        )


class RelayLog:
    """The calls the head passed on since the driver's oldest snapshot of a receiver.

    Entries are :class:`~dana.ps.protocol.Entry` (``args[s]``: the call's argument for
    shard ``s``; ``args[0]``: the standby's, shard 0's own). ``kept[s]``: the count that
    the driver's latest snapshot of receiver ``s`` (0: the standby) covers.

    **Bound**: at most ``limit`` bytes of pushed slices are held in memory. A call that
    would go past it is spilled: pickled to anonymous temporary files in ``TMPDIR``
    (:class:`SpillFiles`, in segments of ``segment`` bytes: by default the bound, within
    :data:`SEGMENT_BYTES`) and read back when it is replayed or sent to a new standby.
    Nothing is dropped, so a rebuild is as exact as before; only its replay reads from
    disk. A segment's disk space is freed once every call in it is trimmed.
    ``peak_bytes`` is the peak in memory, ``disk.peak_bytes`` on disk.

    **A full disk**: the call that could not be spilled, and every later one, is kept in
    memory past the bound, and ``full`` holds the error's message: the run cannot keep
    its bound, so it stops there (the head takes no more calls, :mod:`dana.ps.head`; the
    driver checkpoints that moment and ends the run, exit status 2). The log stays whole.
    """

    def __init__(self, shards: int, limit: int = RELAY_LOG_BYTES, segment: int | None = None):
        self.count = 0  # calls logged so far: the number of the last one
        self.calls: deque[Entry | Spilled] = deque()
        self.kept = [0] * shards
        self.limit = limit
        self.bytes = 0  # of the arrays held in memory
        self.peak, self.peak_bytes = 0, 0  # the most held at once (for dist.json)
        least, most = SEGMENT_BYTES
        self.disk = SpillFiles(min(max(limit, least), most) if segment is None else segment)
        self.full: str | None = None  # why a spill failed (the disk is full), once it has

    def add(self, method: Method, args: list[Pull | Push | None]) -> Entry:
        """Log a new call (``args[s]``: receiver ``s``'s), numbered next."""
        entry = Entry(self.count + 1, method, args)
        self._keep(entry)
        return entry

    def append(self, entry: Entry) -> None:
        """Log an entry of another log (the head's, on its standby); a repeat is not
        logged again."""
        if entry.number <= self.count:
            return
        if entry.number != self.count + 1:
            if self.calls:
                raise RuntimeError(
                    f"relayed call {entry.number} after {self.count}: one is missing"
                )
            self.count = entry.number - 1  # a rebuilt standby's log starts at the head's oldest
        self._keep(entry)

    def _keep(self, entry: Entry) -> None:
        item: Entry | Spilled = entry
        if self.full is None and self.bytes + entry.nbytes > self.limit:
            try:
                item = self.disk.put(entry)
            except WriteError as e:  # (nothing written: kept in memory, the run stops)
                self.full = str(e)
        self.calls.append(item)
        if item is entry:
            self.bytes += entry.nbytes
        self.count = entry.number
        self.peak = max(self.peak, len(self.calls))
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def _load(self, item: Entry | Spilled) -> Entry:
        return item if isinstance(item, Entry) else self.disk.get(item)

    def entries(self) -> Iterator[Entry]:
        """Every logged call, oldest first (a spilled one read back from disk)."""
        for item in list(self.calls):
            yield self._load(item)

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[list[Entry]]:
        """The logged calls in lists of about ``size`` bytes at most (one call at least):
        what a new standby is sent, so that the log is never all in memory at once."""
        chunk: list[Entry] = []
        held = 0
        for entry in self.entries():
            if chunk and held + entry.nbytes > size:
                yield chunk
                chunk, held = [], 0
            chunk.append(entry)
            held += entry.nbytes
        if chunk:
            yield chunk

    def trim(self, shard: int, covered: int) -> None:
        """Receiver ``shard``'s latest snapshot covers the calls up to ``covered``."""
        self.kept[shard] = max(self.kept[shard], covered)
        oldest = min(self.kept)
        while self.calls and self.calls[0].number <= oldest:
            item = self.calls.popleft()
            if isinstance(item, Spilled):
                self.disk.drop(item)  # (a segment with no call left: its space freed)
            else:
                self.bytes -= item.nbytes

    def counters(self) -> dict[str, int]:
        """For ``dist.json``: the calls ever logged, the peak in memory (calls, bytes), the
        calls spilled to disk and the peak on disk."""
        return {
            "relayed_calls": self.count,
            "log_peak_calls": self.peak,
            "log_peak_bytes": self.peak_bytes,
            "log_limit_bytes": self.limit,
            "log_spilled_calls": self.disk.total_calls,
            "log_peak_spilled_bytes": self.disk.peak_bytes,
        }

    def replay(self, actor: Any, shard: int, covered: int) -> int:
        """Send ``actor`` (the new shard ``shard >= 1``) every call after ``covered``, in
        order; how many. Calls before ``covered`` must not have been trimmed."""
        if covered < self.kept[shard]:
            raise RuntimeError(f"shard {shard}'s calls up to {self.kept[shard]} are gone")
        replayed = 0
        for entry in self.entries():
            if entry.number > covered:
                actor.relayed.remote(entry.call(shard))
                replayed += 1
        return replayed
