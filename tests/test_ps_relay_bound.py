"""Shard 0's relay log is bounded in memory (dana/ps/recovery.py: ``--relay-log-bytes``):
calls past the bound go to temporary files and come back whole when replayed, sent to
a new standby, or resent by a promoted one; the files are bounded too (trimmed calls
free their disk space), and a full disk is a clear error. Units, no Ray; and one run on
a real local Ray with a tiny bound, a shard rebuilt from a spilled log."""

from __future__ import annotations

import errno
import io
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny
from fault_injection import Direct, Faults, check_every_shard, run_with_faults

from dana.errors import DanaError
from dana.ps.head import HeadServer
from dana.ps.protocol import Method, Push
from dana.ps.recovery import RelayLog, Spilled
from dana.ps.settings import server_settings


def push(n: int, size: int = 4) -> list[Push]:
    piece = np.full(size, n, np.float32)
    return [Push(0, n, piece), Push(0, n, piece, 0.0)]


def test_past_the_bound_calls_go_to_disk_and_come_back_whole():
    log = RelayLog(shards=2, limit=2 * 32)  # two pushes of 2 x 16 bytes in memory
    for n in range(1, 8):
        log.add(Method.PUSH, push(n))
    assert log.bytes == 64 and log.peak_bytes == 64  # the bound holds
    assert log.disk.calls == 5 and log.disk.total_calls == 5 and log.disk.bytes > 0
    entries = list(log.entries())
    assert [e.number for e in entries] == list(range(1, 8))
    for n, entry in enumerate(entries, start=1):
        for part, sent in zip(entry.args, push(n)):
            np.testing.assert_array_equal(part.message, sent.message)
            assert (part.worker, part.seq) == (sent.worker, sent.seq)
    got: list[Any] = []

    class Recorder:
        relayed = type("M", (), {"remote": staticmethod(lambda call: got.append(call))})

    assert log.replay(Recorder(), shard=1, covered=3) == 4
    assert [c.arg.seq for c in got] == [4, 5, 6, 7]
    assert all(c.arg.message[0] == c.arg.seq for c in got)
    assert [len(chunk) for chunk in log.chunks(size=40)] == [1] * 7  # one call per chunk
    assert sum(map(len, log.chunks(size=10**6))) == 7
    # Trimmed oldest first: memory freed, then the disk once no spilled call is left.
    log.trim(0, 5)
    log.trim(1, 5)
    assert log.bytes == 0 and log.disk.calls == 2 and log.disk.bytes > 0
    log.trim(0, 7)
    log.trim(1, 7)
    assert not log.calls and log.disk.calls == log.disk.bytes == 0 and not log.disk.segments
    log.add(Method.PUSH, push(8))  # in memory again
    assert log.bytes == 32 and log.disk.calls == 0
    assert log.counters()["log_spilled_calls"] == 5


def test_a_standby_attached_and_promoted_from_a_spilled_log_is_its_head():
    """A head whose log is mostly on disk (a bound of one push) fills a new standby, in
    chunks, and the standby, promoted, equals the head bit for bit."""
    config = tiny(algorithm="dana-slim", workers=2, servers=1, relay_log_bytes=40)
    options = dict(server_settings(config, 8, 100)[0], end=None, evals=[], checkpoints=[])

    def server(**kw: Any) -> HeadServer:
        return HeadServer(np.zeros(8, np.float32), **options, **kw)

    head, standby = server(replicated=True), server(standby=True)
    head.begin(0.0)
    standby.begin(0.0)
    rng = np.random.default_rng(0)
    head.relay_pull(0, True)
    head.relay_pull(1, True)
    for seq in range(1, 9):
        for w in (0, 1):
            head.relay_exchange([Push(w, seq, rng.standard_normal(8).astype(np.float32), 1.0)])
    log = head.relay.log
    assert log.bytes <= 40 and log.disk.calls > 10
    assert head.relay.attach(Direct(standby)) == len(log.calls)
    np.testing.assert_array_equal(standby.master.theta.numpy(), head.master.theta.numpy())
    assert standby.counters()["applied"] == head.counters()["applied"] == [8, 8]
    assert standby.relay.log.bytes <= 40 and standby.relay.log.count == log.count
    assert standby.promote([]) == 0


def disk_held(directory: Path) -> int:
    """The bytes this process holds open in files under ``directory`` (deleted or not),
    as the system counts them: what its spill files take on disk."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
                held += os.stat(f"/proc/self/fd/{fd}").st_size
        except OSError:  # (closed meanwhile: the listing's own descriptor)
            pass
    return held


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")
def test_trimmed_calls_free_their_disk_space_across_many_cycles(tmp_path, monkeypatch):
    """Issue 41: the spill file grew for the whole run while some spilled call was left.
    Now, through 300 cycles of appends and trims that always leave spilled calls
    behind, the disk holds the spilled calls still logged plus one segment at most."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    segment = 1000
    log = RelayLog(shards=2, limit=4 * 32, segment=segment)  # 4 pushes in memory
    rng = random.Random(41)
    call = 0  # the largest spilled call's bytes
    for _ in range(300):
        for _ in range(rng.randrange(1, 12)):
            log.add(Method.PUSH, push(log.count + 1))
        # every receiver's snapshot covers all but the last 1 to 8 calls
        covered = log.count - rng.randrange(1, 9)
        log.trim(0, covered)
        log.trim(1, covered)
        spilled = [item for item in log.calls if isinstance(item, Spilled)]
        held = disk_held(tmp_path)
        assert held == log.disk.bytes and log.disk.calls == len(spilled)
        call = max([call, *(item.length for item in spilled)])
        assert held <= sum(item.length for item in spilled) + segment + call
    # far more went through the disk than it ever held
    assert log.disk.total_calls * call > 50 * log.disk.peak_bytes
    # the log is whole: every call kept, in order, its slices as pushed
    numbers = [entry.number for entry in log.entries()]
    assert numbers == list(range(log.count - len(numbers) + 1, log.count + 1))
    assert all(entry.args[1].message[0] == entry.number for entry in log.entries())
    log.trim(0, log.count)
    log.trim(1, log.count)
    assert disk_held(tmp_path) == 0 and not log.disk.segments


class FullDisk(io.BytesIO):
    """A spill file on a disk that is full (``full``): its writes fail as the system's."""

    full = True

    def write(self, data: Any) -> int:
        if FullDisk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_full_disk_keeps_the_log_whole_in_memory_and_says_why(tmp_path, monkeypatch):
    """ENOSPC on a spill write: the spill files raise a :class:`~dana.errors.DanaError`
    naming the directory and the fixes; the log keeps that call, and every later one, in
    memory past its bound, numbered as ever, and holds the message (``full``: the run
    stops there, its checkpoint taken)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: FullDisk())
    monkeypatch.setattr(FullDisk, "full", True)
    log = RelayLog(shards=2, limit=2 * 32)
    for n in range(1, 3):
        log.add(Method.PUSH, push(n))  # in memory
    assert log.full is None
    log.add(Method.PUSH, push(3))
    for words in (str(tmp_path), "no space left", "free space", "--relay-log-bytes", "TMPDIR"):
        assert words in log.full, words
    FullDisk.full = False  # (once full, the log no longer tries the disk)
    log.add(Method.PUSH, push(4))
    assert log.disk.calls == 0 and log.bytes == 4 * 32 > log.limit
    assert [entry.number for entry in log.entries()] == [1, 2, 3, 4]
    assert [entry.args[1].message[0] for entry in log.entries()] == [1, 2, 3, 4]
    FullDisk.full = True
    with pytest.raises(DanaError) as raised:
        log.disk.put(next(log.entries()))
    assert isinstance(raised.value.__cause__, OSError) and "no space left" in str(raised.value)


def test_another_write_error_is_not_taken_for_a_full_disk(monkeypatch):
    class Broken(io.BytesIO):
        def write(self, data: Any) -> int:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: Broken())
    log = RelayLog(shards=2, limit=0)
    with pytest.raises(OSError) as raised:
        log.add(Method.PUSH, push(1))
    assert not isinstance(raised.value, DanaError) and raised.value.errno == errno.EIO


@pytest.mark.ray
def test_a_shard_rebuilt_from_a_spilled_log_on_ray_is_exact(local_ray, tmp_path):
    """A real run whose relay log holds one push in memory (the rest spilled): shard 1,
    killed mid-run, is rebuilt from its snapshot and the spilled calls; every push
    applied exactly once on every shard, and the spill files' peak stays bounded."""
    config = tiny(
        algorithm="dana-slim", workers=3, servers=2, time_scale=0.0005, relay_log_bytes=4096
    )
    runner, faults = run_with_faults(config, tmp_path / "run", [(40, "shard:1")])
    assert [what for _, what in faults.done] == ["shard:1"], faults.done
    dist = check_every_shard(runner, steps=3 * 32)
    assert [r["shard"] for r in dist["shards_rebuilt"]] == [1]
    assert dist["log_spilled_calls"] > 0 and dist["log_peak_bytes"] <= 4096


@pytest.mark.ray
def test_a_full_disk_on_ray_ends_the_run_with_a_checkpoint_that_resumes(local_ray, tmp_path):
    """A real run whose head spills every push (a bound of 4 KB): from step 30 its spill
    files lie on ``/dev/full`` (every write fails with the system's ENOSPC). The run ends
    with a :class:`~dana.errors.WriteError` (exit status 2) naming the disk and the fixes
    and a checkpoint of that moment, consistent on every shard; ``--resume`` with space
    again finishes it, every push applied once on every shard."""
    from dana.errors import WriteError
    from dana.ps.accounting import check_run
    from dana.train.training import train

    def onto_dev_full(server: Any) -> None:  # (run in the head's process)
        import tempfile

        tempfile.TemporaryFile = lambda **kw: open("/dev/full", "w+b")  # noqa: SIM115
        server.relay.log.disk.segment = 0  # (the next spill opens a new file)

    class FullDiskAt(Faults):
        def update(self, steps: int, loss: float) -> None:
            if self.actions and steps >= self.actions[0][0]:
                head = self.runner.shards.servers[0]
                ray.get(head.__ray_call__.remote(onto_dev_full))
                self.done.append(self.actions.pop(0))

    import ray

    config = tiny(algorithm="dana-slim", workers=2, servers=2, time_scale=0.0005,
                  relay_log_bytes=4096)  # fmt: skip
    out = tmp_path / "run"
    with pytest.raises(WriteError) as raised:
        run_with_faults(config, out, [(30, "full")], FullDiskAt)
    message = str(raised.value)
    for words in ("no space left on the disk", "--relay-log-bytes", "TMPDIR", "--resume"):
        assert words in message, message
    stopped = int(message.split("a checkpoint at step ")[1].split(":")[0])
    assert 30 <= stopped < 3 * 32, message
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert {int(s["steps"]) for s in saved["servers"]} == {stopped}  # every shard alike
    summary = train(config, out, resume=True, progress=False)
    dist = json.loads((out / "dist.json").read_text())
    problems = check_run(dist, summary, 3 * 32)
    assert not problems, problems
