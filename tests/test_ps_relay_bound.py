"""Shard 0's relay log is bounded in memory (dana/ps/recovery.py: ``--relay-log-bytes``):
calls past the bound go to a temporary file and come back whole when replayed, sent to
a new standby, or resent by a promoted one. Units, no Ray."""

from __future__ import annotations

from typing import Any

import numpy as np
from conftest import tiny
from fault_injection import Direct

from dana.ps.head import HeadServer
from dana.ps.protocol import Method, Push
from dana.ps.recovery import RelayLog
from dana.ps.settings import server_settings


def push(n: int, size: int = 4) -> list[Push]:
    piece = np.full(size, n, np.float32)
    return [Push(0, n, piece), Push(0, n, piece, 0.0)]


def test_past_the_bound_calls_go_to_disk_and_come_back_whole():
    log = RelayLog(shards=2, limit=2 * 32)  # two pushes of 2 x 16 bytes in memory
    for n in range(1, 8):
        log.add(Method.PUSH, push(n))
    assert log.bytes == 64 and log.peak_bytes == 64  # the bound holds
    assert log.spilled == 5 and log.spilled_calls == 5 and log.spilled_bytes > 0
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
    assert log.bytes == 0 and log.spilled == 2 and log.spilled_bytes > 0
    log.trim(0, 7)
    log.trim(1, 7)
    assert not log.calls and log.spilled == log.spilled_bytes == 0
    log.add(Method.PUSH, push(8))  # in memory again
    assert log.bytes == 32 and log.spilled == 0
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
    assert log.bytes <= 40 and log.spilled > 10
    assert head.relay.attach(Direct(standby)) == len(log.calls)
    np.testing.assert_array_equal(standby.master.theta.numpy(), head.master.theta.numpy())
    assert standby.counters()["applied"] == head.counters()["applied"] == [8, 8]
    assert standby.relay.log.bytes <= 40 and standby.relay.log.count == log.count
    assert standby.promote([]) == 0
