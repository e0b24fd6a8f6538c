"""The codecs of the pushes (dana.train.rules.codecs, ``--compress``): round-trip error bounds,
payload sizes, error feedback, the simulator's state and clock, and the option's checks.

The cross-runner agreement (the servers decoding what the workers encode equal the
simulator, bit for bit) is tests/test_ps_runtime.py::test_a_codec_on_the_servers_is_the_simulators.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from conftest import make_least_squares, make_simulator, tiny

from dana.errors import ConfigError
from dana.train.cluster.network import Network
from dana.train.config import TrainConfig
from dana.train.rules.codecs import (
    INT8_BLOCK,
    Payload,
    Wire,
    build_codec,
    part_bounds,
    push_bytes,
)

CODECS = ["none", "fp16", "bf16", "int8", "topk:0.01", "topk:0.3"]


def sample(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values over many magnitudes (a gradient's spread), some exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 10 ** torch.empty(n, dtype=torch.float64).uniform_(-4, 2, generator=g)  # fmt: skip
    x[::97] = 0
    return x.to(dtype)


@pytest.mark.parametrize("spec", CODECS)
@pytest.mark.parametrize("n", [1, 255, 256, 1000, 4097])
def test_payload_bytes_and_determinism(spec, n):
    """A payload's bytes are what the codec says (the clock charges those), its arrays
    are the same for the same input, and it decodes to the input's dtype and length."""
    codec = build_codec(spec)
    for dtype, value_bytes in ((torch.float32, 4), (torch.float64, 8)):
        x = sample(n, dtype=dtype)
        a, b = codec.encode(x), codec.encode(x.clone())
        assert a.nbytes == codec.nbytes(n, value_bytes)
        assert all(np.array_equal(u, v) for u, v in zip(a.arrays, b.arrays))
        y = codec.decode(a)
        assert y.dtype == dtype and y.shape == (n,)
        assert torch.equal(y, codec.decode(a.copy()))
        out = torch.full((n,), 7.0, dtype=dtype)  # a buffer kept across pushes, not zeroed
        assert codec.decode(a, out) is out and torch.equal(out, y)
    with pytest.raises(ValueError, match="into"):
        codec.decode(codec.encode(sample(n)), torch.empty(n + 1))


def test_sizes_on_the_wire():
    n = 25_600_000
    assert build_codec("none").nbytes(n, 4) == 4 * n
    assert build_codec("fp16").nbytes(n, 4) == build_codec("bf16").nbytes(n, 4) == 2 * n
    assert build_codec("int8").nbytes(n, 4) == n + 4 * n // INT8_BLOCK  # 1.016 bytes a value
    assert build_codec("topk:0.01").nbytes(n, 4) == 8 * n // 100


def test_none_is_exact():
    x = sample(3000)
    assert torch.equal(build_codec("none").decode(build_codec("none").encode(x)), x)


def test_fp16_relative_error_bound():
    """Round to nearest in half precision: |y - x| <= 2^-11 |x| in the normal range
    (6.1e-5 <= |x| <= 65504); beyond it, saturation at +-65504, never inf."""
    codec = build_codec("fp16")
    x = sample(20_000)
    y = codec.decode(codec.encode(x))
    normal = (x.abs() >= 2**-14) & (x.abs() <= 65504)
    assert ((y - x).abs()[normal] <= 2**-11 * x.abs()[normal]).all()
    assert ((y - x).abs()[~normal] <= 2**-25).all()  # (subnormals: absolute half an ulp)
    big = torch.tensor([1e6, -1e9, 70000.0, 1.0])
    assert codec.decode(codec.encode(big)).tolist() == [65504.0, -65504.0, 65504.0, 1.0]


def test_bf16_relative_error_bound():
    codec = build_codec("bf16")
    x = sample(20_000)
    y = codec.decode(codec.encode(x))
    assert ((y - x).abs() <= 2**-8 * x.abs()).all()
    assert torch.equal(y[x == 0], x[x == 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_int8_error_is_at_most_half_a_step_per_element(dtype):
    """Blockwise absmax scale s = max|x|/127 over each block of 256: every element within
    s/2 of its value, each block's largest exact up to rounding, zeros exact."""
    codec = build_codec("int8")
    n = 10 * INT8_BLOCK + 77
    x = sample(n, dtype=dtype)
    x[:INT8_BLOCK] = 0  # a block of zeros: scale 0
    payload = codec.encode(x)
    codes, scale = payload.arrays
    assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.size == 11
    assert scale[0] == 0 and np.abs(codes).max() <= 127
    y = codec.decode(payload)
    step = torch.from_numpy(scale).to(dtype).repeat_interleave(INT8_BLOCK)[:n]
    eps = torch.finfo(dtype).eps
    assert ((y - x).abs() <= step / 2 * (1 + 8 * eps) + 1e-30).all()
    assert torch.equal(y[x == 0], x[x == 0])


def test_topk_keeps_the_largest_exactly():
    codec = build_codec("topk:0.05")
    x = sample(4001)
    payload = codec.encode(x)
    index, values = payload.arrays
    k = math.ceil(0.05 * 4001)
    assert len(index) == k and index.dtype == np.int32 and np.all(np.diff(index) > 0)
    y = codec.decode(payload)
    kept = torch.from_numpy(index).long()
    assert torch.equal(y[kept], x[kept])  # exact on the kept entries
    mask = torch.ones(4001, dtype=torch.bool)
    mask[kept] = False
    assert (y[mask] == 0).all()
    assert x[mask].abs().max() <= x[kept].abs().min()  # the largest magnitudes


@pytest.mark.parametrize("servers", [1, 3])
def test_error_feedback_sends_every_message_in_the_end(servers):
    """Stich et al. (2018): the worker sends C(m + r) and keeps r = m + r - C(m + r), so
    the decoded messages plus the final residual sum to the raw messages."""
    d, k = 1000, 2
    wire = Wire(build_codec("topk:0.02"), k, d, servers, torch.float64)
    raw, sent = torch.zeros(k, d, dtype=torch.float64), torch.zeros(k, d, dtype=torch.float64)
    for t in range(50):
        for i in range(k):
            m = sample(d, seed=100 * t + i, dtype=torch.float64)
            payloads = wire.encode(i, m)
            assert len(payloads) == servers
            assert sum(p.nbytes for p in payloads) == wire.push_bytes(8)[0]
            raw[i] += m
            sent[i] += wire.decode(payloads)
    torch.testing.assert_close(sent + wire.residual, raw, rtol=1e-12, atol=1e-12)
    assert wire.residual.abs().sum() > 0
    wire.leave(0)  # a worker that leaves loses its residual
    assert (wire.residual[0] == 0).all() and (wire.residual[1] != 0).any()


def test_parts_are_the_runtimes_shards():
    from dana.ps.layout import Layout

    for d, s in ((10, 3), (1000, 7), (5, 5)):
        assert part_bounds(d, s) == Layout(d, s, 0).bounds
    # shards of 334, 333, 333 values: two blocks each, a float32 scale per block
    assert push_bytes("int8", 1000, 3, 4) == 1000 + 3 * 2 * 4
    assert push_bytes("none", 1000, 3, 8) == 8000


def test_a_bad_codec_names_the_codecs():
    for bad in ("zip", "topk", "topk:0", "topk:1.5", "topk:x", "int8:3", "FP16"):
        with pytest.raises(ConfigError, match=r"--compress .*none, fp16, bf16, int8, topk:F"
                           if not bad.startswith("topk") else r"--compress .*topk:0.01"):  # fmt: skip
            TrainConfig(compress=bad, dataset="synthetic").validate()
    with pytest.raises(ValueError, match="a int8 payload given to the fp16 codec"):
        build_codec("fp16").decode(build_codec("int8").encode(torch.ones(3)))
    assert TrainConfig(compress="topk:0.01").validate().compress == "topk:0.01"


def test_the_simulator_resumes_exactly_with_a_residual(tmp_path):
    """topk's residual is part of the simulator's state: a run saved midway and loaded
    into a fresh simulator continues bit for bit as the whole."""

    def make():
        return make_simulator("dana-slim", 4, make_least_squares(d=40, n=100), seed=5,
                              compress="topk:0.1", servers=2)  # fmt: skip

    whole = make()
    whole.run(pushes=90)
    first = make()
    first.run(pushes=41)
    state = first.state_dict()
    assert state["wire"]["residual"].abs().sum() > 0
    buffer = io.BytesIO()
    torch.save(state, buffer)  # a checkpoint goes through a file
    buffer.seek(0)
    second = make()
    second.load_state_dict(torch.load(buffer, weights_only=True))
    second.run(pushes=90)
    assert torch.equal(second.params(), whole.params())
    assert torch.equal(second.wire.residual, whole.wire.residual)
    assert np.array_equal(second.log.numpy()["loss"], whole.log.numpy()["loss"])
    with pytest.raises(ValueError, match="no residual"):
        make().load_state_dict({**state, "wire": {}})


def test_a_codec_changes_the_run_and_none_does_not():
    problem = make_least_squares(d=12, n=128)
    plain = make_simulator("dana-slim", 3, problem, seed=1)
    plain.run(pushes=200)
    none = make_simulator("dana-slim", 3, problem, seed=1, compress="none")
    none.run(pushes=200)
    assert none.wire is None and torch.equal(none.params(), plain.params())
    for spec in ("bf16", "int8", "topk:0.25"):
        coded = make_simulator("dana-slim", 3, problem, seed=1, compress=spec)
        coded.run(pushes=200)
        assert not torch.equal(coded.params(), plain.params())
        assert coded.log.loss[-1] < 2 * plain.log.loss[-1]  # still converges


def network_bound_cluster() -> dict:
    """Constant steps of 1 ms, 1 Gbit/s links: a push of 4,000 float32 (16 kB) takes
    0.128 ms on its worker's link."""
    return {
        "name": "thin",
        "compute": {"model": "constant"},
        "network": {"bandwidth_gbps": 1.0, "server_bandwidth_gbps": 1.0},
    }


def test_the_clock_charges_the_payloads_bytes():
    """On a cluster a push costs its payload's bytes (each shard's part encoded), a
    pull the d values; by hand: 1 Gbit/s carries 125,000 bytes a ms."""
    cluster = network_bound_cluster()
    from dana.train.cluster.model import resolve_cluster

    network = resolve_cluster(cluster, "constant")["network"]
    for spec, nbytes in (("none", 16000), ("bf16", 8000), ("int8", 4000 + 4 * 16),
                         ("topk:0.01", 40 * 8)):  # fmt: skip
        net = Network(network, 2, 1, 4000, 4, build_codec(spec))
        assert net.push_bytes == nbytes and net.message_bytes == 16000
        assert net.push_worker_ms[0] == pytest.approx(nbytes / 125_000)
        assert net.worker_ms[0] == pytest.approx(16000 / 125_000)  # pulls: unchanged
        assert net.to_server(0, 1.0) == pytest.approx(1.0 + nbytes / 125_000)

    from dana import algorithms
    from dana.sim.simulator import Simulator
    from dana.train.task.batches import BatchStream

    problem = make_least_squares(d=4000, n=64)
    times = {}
    for spec in ("none", "bf16", "int8", "topk:0.01"):
        sim = Simulator(algorithms.build("asgd"), torch.zeros(4000, dtype=torch.float64),
                        problem.gradient,
                        BatchStream(64, 8), 2, lr=0.01, timing="constant", cluster=cluster,
                        compress=spec,
                        weight_decay=0.0)  # fmt: skip
        assert sim.clock is not None
        sim.run(pushes=40)
        times[spec] = sim.sim_time
    assert times["topk:0.01"] < times["int8"] < times["bf16"] < times["none"]


def test_config_and_summary_record_the_codec(tmp_path):
    from dana.train.training import train

    out = tmp_path / "run"
    config = tiny(backend="sim", epochs=0.25, compress="int8", servers=2, cluster="datacenter")
    summary = train(config, out, progress=False)
    assert json.loads((out / "config.json").read_text())["compress"] == "int8"
    assert summary["compress"] == "int8"
    plain = train(tiny(backend="sim", epochs=0.25), tmp_path / "plain", progress=False)
    d = plain["push_bytes"] // 4  # (float32 values)
    assert plain["compress"] == "none" and summary["push_bytes"] == push_bytes("int8", d, 2, 4)


def test_payload_is_plain_data():
    """A payload is numpy arrays and plain values (what Ray sends without a custom
    serialiser), its own copy independent of the original."""
    p = build_codec("int8").encode(torch.arange(5.0))
    assert isinstance(p, Payload) and isinstance(p.n, int) and p.dtype == "float32"
    q = p.copy()
    q.arrays[0][0] = 99
    assert p.arrays[0][0] != 99


@pytest.mark.parametrize("spec", CODECS)
def test_read_only_payloads_decode(spec):
    """A payload from Ray's object store is read-only: the decoders read it in place
    (no copy, no write), into a fresh tensor or a kept buffer."""
    codec = build_codec(spec)
    x = sample(777)
    payload = codec.encode(x)
    for a in payload.arrays:
        a.setflags(write=False)
    y = codec.decode(payload)
    assert torch.equal(y, codec.decode(codec.encode(x)))
    assert torch.equal(codec.decode(payload, torch.empty(777)), y)


def test_the_closing_line_says_the_bytes_of_a_compressed_push(tmp_path):
    from clirun import run_dana

    args = ["train", "--dataset", "synthetic", "--model", "linear", "--train-size", "256",
            "--test-size", "64", "--epochs", "0.5", "--quiet"]  # fmt: skip
    squeezed = run_dana(*args, "--compress", "int8", "--out", str(tmp_path / "int8"))
    summary = json.loads((tmp_path / "int8" / "summary.json").read_text())
    assert f"{summary['push_bytes']:,} bytes a push (int8)" in squeezed.stdout.splitlines()[-1]
    plain = run_dana(*args, "--out", str(tmp_path / "none"))
    assert "bytes a push" not in plain.stdout
