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

import pickle
import tempfile
from collections import deque
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

from dana.ps.protocol import Entry, Method, Pull, Push

#: Seconds between two snapshots of a shard ``s >= 1`` (or the standby) for its recovery.
SNAPSHOT_SECONDS = 1.0

#: The default bound on the bytes a relay log holds in memory (``--relay-log-bytes``).
RELAY_LOG_BYTES = 2 * 1024**3

#: The most bytes of logged calls sent to a new standby in one call (:meth:`RelayLog.chunks`).
CHUNK_BYTES = 256 * 1024**2


class Spilled(NamedTuple):
    """A logged call kept on disk: its number, and where its pickle lies in the spill file."""

    number: int
    offset: int
    length: int


class RelayLog:
    """The calls the head passed on since the driver's oldest snapshot of a receiver.

    Entries are :class:`~dana.ps.protocol.Entry` (``args[s]``: the call's argument for
    shard ``s``; ``args[0]``: the standby's, shard 0's own). ``kept[s]``: the count that
    the driver's latest snapshot of receiver ``s`` (0: the standby) covers.

    **Bound**: at most ``limit`` bytes of pushed slices are held in memory. A call that
    would go past it is spilled: pickled to an anonymous temporary file (deleted by the
    system when the process ends, however it ends) and read back when it is replayed
    or sent to a new standby. Nothing is dropped, so a rebuild is as exact as before;
    only its replay reads from disk. The file is emptied whenever no spilled call is
    left (the log is trimmed oldest first). ``peak_bytes`` is the peak in memory,
    ``peak_spilled_bytes`` on disk.
    """

    def __init__(self, shards: int, limit: int = RELAY_LOG_BYTES):
        self.count = 0  # calls logged so far: the number of the last one
        self.calls: deque[Entry | Spilled] = deque()
        self.kept = [0] * shards
        self.limit = limit
        self.bytes = 0  # of the arrays held in memory
        self.peak, self.peak_bytes = 0, 0  # the most held at once (for dist.json)
        self.spill: IO[bytes] | None = None  # the spill file, once needed
        self.spilled = self.spilled_bytes = 0  # calls and bytes on disk now
        self.spilled_calls = self.peak_spilled_bytes = 0  # ever spilled; the most at once

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
        self.count = entry.number
        if self.bytes + entry.nbytes > self.limit:
            self.calls.append(self._spill(entry))
        else:
            self.calls.append(entry)
            self.bytes += entry.nbytes
        self.peak = max(self.peak, len(self.calls))
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def _spill(self, entry: Entry) -> Spilled:
        if self.spill is None:
            self.spill = tempfile.TemporaryFile(prefix="dana-relay-log-")
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        offset = self.spilled_bytes
        self.spill.seek(offset)
        self.spill.write(data)
        self.spilled += 1
        self.spilled_calls += 1
        self.spilled_bytes += len(data)
        self.peak_spilled_bytes = max(self.peak_spilled_bytes, self.spilled_bytes)
        return Spilled(entry.number, offset, len(data))

    def _load(self, item: Entry | Spilled) -> Entry:
        if isinstance(item, Entry):
            return item
        self.spill.seek(item.offset)
        return pickle.loads(self.spill.read(item.length))

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
                self.spilled -= 1
            else:
                self.bytes -= item.nbytes
        if self.spill is not None and not self.spilled and self.spilled_bytes:
            self.spill.truncate(0)  # no spilled call left: the disk space back
            self.spilled_bytes = 0

    def counters(self) -> dict[str, int]:
        """For ``dist.json``: the calls ever logged, the peak in memory (calls, bytes), the
        calls spilled to disk and the peak on disk."""
        return {
            "relayed_calls": self.count,
            "log_peak_calls": self.peak,
            "log_peak_bytes": self.peak_bytes,
            "log_limit_bytes": self.limit,
            "log_spilled_calls": self.spilled_calls,
            "log_peak_spilled_bytes": self.peak_spilled_bytes,
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
