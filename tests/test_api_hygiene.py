"""The Python entries check their arguments as the command line does, and behave in a
notebook: ``dana.fit`` and ``dana.simulate`` refuse bad arguments with a ValueError or
TypeError naming the argument and the fix; ``fit(out=DIR)`` follows ``dana train
--out``'s rules; no plot changes matplotlib's backend; MLflow run names and tags, a
TensorBoard directory; an unreachable Ray cluster fails within a deadline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dana
from dana.errors import ArgumentTypeError, ConfigError, DanaError

FAST = {"workers": 2, "epochs": 1, "batch_size": 16, "lr": 0.05}


def _data(n: int = 64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long()


def _model() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


X, Y = _data()
NAN_X = X.clone()
NAN_X[3, 1] = math.nan

# (id, entry, positional arguments, keywords, error class, fragments of the message)
CASES = [
    ("fit-lengths", dana.fit, (_model, (X, Y[:10])), {}, ValueError, ["one row per example", "(10,)"]),
    ("fit-epochs-neg", dana.fit, (_model, (X, Y)), {"epochs": -1}, ValueError, ["epochs", "(0, "]),
    ("fit-epochs-0", dana.fit, (_model, (X, Y)), {"epochs": 0}, ValueError, ["epochs", "got 0"]),
    ("fit-workers-0", dana.fit, (_model, (X, Y)), {"workers": 0}, ValueError, ["workers", ">= 1"]),
    ("fit-lr-nan", dana.fit, (_model, (X, Y)), {"lr": math.nan}, ValueError, ["lr", "nan"]),
    ("fit-workers-str", dana.fit, (_model, (X, Y)), {"workers": "2"}, ValueError, ["workers", "'2'"]),
    ("fit-x-nan", dana.fit, (_model, (NAN_X, Y)), {}, ValueError, ["train: x holds 1 NaN", "nan_to_num"]),
    ("fit-test-nan", dana.fit, (_model, (X, Y), (NAN_X, Y)), {}, ValueError, ["test: x holds 1 NaN"]),
    ("fit-model-int", dana.fit, (3, (X, Y)), {}, TypeError, ["model must be", "got int"]),
    ("fit-data-str", dana.fit, (_model, "data"), {}, TypeError, ["expected (x, y)", "got str"]),
    ("fit-loss", dana.fit, (_model, (X, Y)), {"loss_fn": 3}, TypeError, ["loss_fn must be a function"]),
    ("fit-decay-str", dana.fit, (_model, (X, Y)), {"decay_epochs": "ab"}, ValueError, ["decay_epochs"]),
    ("fit-address-sim", dana.fit, (_model, (X, Y)), {"address": "auto"}, ValueError, ["address", "backend ray"]),
    ("fit-run-name", dana.fit, (_model, (X, Y)), {"run_name": "a"}, ValueError, ["run_name", "mlflow="]),
    ("fit-tags-list", dana.fit, (_model, (X, Y)), {"tags": ["a"]}, TypeError, ["tags must be a mapping"]),
    ("sim-lengths", dana.simulate, (_model(), X, Y[:10]), {}, ValueError, ["one row per example"]),
    ("sim-x-nan", dana.simulate, (_model(), NAN_X, Y), {}, ValueError, ["x holds 1 NaN", "1 of 64 rows"]),
    ("sim-factory", dana.simulate, (_model, X, Y), {}, TypeError, ["torch.nn.Module", "got function"]),
    ("sim-epochs-0", dana.simulate, (_model(), X, Y), {"epochs": 0}, ValueError, ["epochs"]),
    ("sim-lr-str", dana.simulate, (_model(), X, Y), {"lr": "0.1"}, ValueError, ["lr", "'0.1'"]),
    ("fit-float-labels", dana.fit, (_model, (X, Y.float())), {}, ValueError, ["loss_fn", "torch.float32", "y.long()"]),
    ("fit-features", dana.fit, (lambda: torch.nn.Linear(5, 2), (X, Y)), {}, ValueError, ["model", "train data's inputs (shape (2, 4)", "input layer"]),
    ("fit-test-features", dana.fit, (_model, (X, Y), (X[:, :3], Y)), {}, ValueError, ["model", "the test data's inputs (shape (2, 3)"]),
    ("fit-callback", dana.fit, (_model, (X, Y)), {"callback": 5}, TypeError, ["unexpected keyword argument 'callback'"]),
    ("fit-out-empty", dana.fit, (_model, (X, Y)), {"out": ""}, ValueError, ["out is empty"]),
    ("sim-callback", dana.simulate, (_model(), X, Y), {"callback": 5}, TypeError, ["callback must be a function", "got int"]),
    ("sim-float-labels", dana.simulate, (_model(), X, Y.float()), {}, ValueError, ["loss_fn", "y.long()"]),
    ("sim-features", dana.simulate, (torch.nn.Linear(5, 2), X, Y), {}, ValueError, ["model", "input layer"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "entry, args, keywords, error, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_argument_is_refused_naming_it(entry, args, keywords, error, fragments) -> None:
    with pytest.raises(error) as caught:
        entry(*args, **{**FAST, **keywords})
    assert isinstance(caught.value, ConfigError | ArgumentTypeError)  # a DanaError too
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


@pytest.mark.parametrize("entry", ["fit", "simulate"])
def test_unknown_keyword_is_refused_as_python_refuses_one(entry: str) -> None:
    args = (_model, (X, Y)) if entry == "fit" else (_model(), X, Y)
    with pytest.raises(TypeError) as caught:
        getattr(dana, entry)(*args, **FAST, tensorbord="logs")
    message = str(caught.value)
    assert message.startswith(f"{entry}() got an unexpected keyword argument 'tensorbord'")
    if entry == "fit":
        assert "(did you mean 'tensorboard'?)" in message
    assert "dana-slim's hyper-parameters: momentum" in message  # listed apart


def test_the_algorithms_own_hyper_parameters_are_taken() -> None:
    result = dana.simulate(_model(), X, Y, **FAST, algorithm="dc-asgd", lc=0.1)
    assert result.simulator.algorithm.hparams()["lc"] == 0.1


# -- fit(out=DIR): dana train --out's rules ---------------------------------------------
@pytest.mark.parametrize("name", ["metrics.csv", "summary.json", "notes.txt"])
def test_fit_never_overwrites_a_file_it_did_not_write(tmp_path: Path, name: str) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("my own file")
    with pytest.raises(ValueError, match="not empty") as caught:
        dana.fit(_model, (X, Y), **FAST, out=out)
    assert name in str(caught.value) and "choose another out" in str(caught.value)
    assert [p.name for p in out.iterdir()] == [name]
    assert (out / name).read_text() == "my own file"


def test_a_failed_fit_leaves_nothing_and_the_rerun_goes_through(tmp_path: Path) -> None:
    calls = [0]

    def failing_loss(out, y):
        calls[0] += 1
        if calls[0] > 3:
            raise RuntimeError("the user's loss failed")
        return torch.nn.functional.cross_entropy(out, y)

    made, existing = tmp_path / "new", tmp_path / "empty"
    existing.mkdir()
    for out in (made, existing):
        calls[0] = 0
        with pytest.raises(RuntimeError, match="the user's loss failed"):
            dana.fit(_model, (X, Y), **FAST, loss_fn=failing_loss, out=out)
    assert not made.exists()  # the folder fit made is gone
    assert existing.is_dir() and not list(existing.iterdir())  # the user's is kept, empty
    result = dana.fit(_model, (X, Y), **FAST, out=made)  # the rerun is not blocked
    assert (made / "summary.json").is_file() and result.run_dir == made


# -- a notebook's state ----------------------------------------------------------------
@pytest.fixture
def svg_backend():
    """matplotlib's backend set to one no plot of dana's would choose, put back after."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    yield "svg"
    matplotlib.use(before)


def test_fit_and_report_leave_matplotlibs_backend_as_it_was(tmp_path: Path, svg_backend) -> None:
    import matplotlib
    from conftest import fake_run

    from dana.cli import main

    dana.fit(_model, (X, Y), **FAST, out=tmp_path / "run")
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    assert matplotlib.get_backend() == svg_backend
    root = tmp_path / "sweep"
    for k, errors in ((1, [0.9, 0.5, 0.2]), (4, [0.9, 0.4, 0.1])):
        fake_run(root, f"slim-k{k}", "dana-slim", k, 0, errors)
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    assert list((tmp_path / "report").rglob("*.png"))
    assert matplotlib.get_backend() == svg_backend


def test_fit_names_and_tags_its_mlflow_run_and_writes_tensorboard_logs(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="MLflow not installed: pip install mlflow-skinny")
    pytest.importorskip("tensorboard", reason="TensorBoard not installed")
    from mlflow.tracking import MlflowClient

    from dana.train.records.tracking import tracking_uri

    store, board = tmp_path / "mlruns", tmp_path / "board"
    dana.fit(_model, (X, Y), **FAST, mlflow=str(store), run_name="trial-7",
             tags={"team": "async", "attempt": 2}, tensorboard=board)  # fmt: skip
    client = MlflowClient(tracking_uri=tracking_uri(str(store)))
    (run,) = client.search_runs([client.get_experiment_by_name("dana").experiment_id])
    assert run.info.run_name == "trial-7"
    assert run.data.tags["team"] == "async" and run.data.tags["attempt"] == "2"
    events = list(board.glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


# -- a Ray cluster that cannot be reached ----------------------------------------------
FIT_CLOSED_PORT = """
import sys, time, torch, dana
from dana.errors import DanaError
x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
start = time.monotonic()
try:
    dana.fit(lambda: torch.nn.Linear(4, 2), (x, y), workers=2, epochs=1, batch_size=16,
             lr=0.05, backend="ray", address=sys.argv[1], out=sys.argv[2])
except DanaError as e:
    print(f"{time.monotonic() - start:.1f} s: {e}")
"""


def test_fit_joining_a_closed_port_fails_within_the_deadline(tmp_path: Path) -> None:
    """In a fresh interpreter (this one may hold the suite's local Ray), on a port held
    bound and not listening: refused, never taken by another process meanwhile."""
    import socket

    pytest.importorskip("ray")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{held.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-c", FIT_CLOSED_PORT, address, str(tmp_path / "run")],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "DANA_CONNECT_TIMEOUT": "2"},
        )  # fmt: skip
    seconds, _, message = done.stdout.partition(" s: ")
    assert message, done.stdout[-2000:] + done.stderr[-2000:]
    assert float(seconds) < 30
    assert f"cannot reach the Ray cluster at --address {address}" in message
    assert "ray start --head" in message
    assert not (tmp_path / "run").exists()  # and the failed fit left nothing


@pytest.mark.ray
def test_fit_to_another_address_than_the_ray_of_this_process_is_refused(local_ray, tmp_path):
    import ray

    current = ray.get_runtime_context().gcs_address
    host, port = current.rsplit(":", 1)
    address = f"{host}:{int(port) + 1}"
    with pytest.raises(DanaError, match=f"connected to {current}, not to --address {address}"):
        dana.fit(_model, (X, Y), **FAST, backend="ray", address=address, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_cluster_that_does_not_answer_is_given_up_at_the_deadline(monkeypatch) -> None:
    import socket

    from dana.ps import cluster

    seen = {}

    def silent(address, timeout):
        seen["timeout"] = timeout
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    monkeypatch.setenv("DANA_CONNECT_TIMEOUT", "0.5")
    with pytest.raises(DanaError, match=r"no answer within 0.5 s \(DANA_CONNECT_TIMEOUT"):
        cluster._check_reachable("10.1.2.3:6379")
    assert seen["timeout"] == 0.5
    monkeypatch.setenv("DANA_CONNECT_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="DANA_CONNECT_TIMEOUT='soon'"):
        cluster._check_reachable("10.1.2.3:6379")


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n", None])
def test_an_address_where_something_else_listens_is_refused_at_once(monkeypatch, answer):
    # (Ray's own connect to it hung for over 5 minutes); a loopback server of ours that
    # answers another protocol, or nothing within the deadline
    import socket
    import threading
    import time

    from dana.ps import cluster

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if answer is not None:
                conn.sendall(answer)
            else:
                time.sleep(1.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("DANA_CONNECT_TIMEOUT", "0.5")
    started = time.monotonic()
    try:
        with pytest.raises(DanaError, match="is not a Ray cluster.*does not answer HTTP/2"):
            cluster._check_reachable(f"127.0.0.1:{port}")
    finally:
        thread.join(timeout=5)
        server.close()
    assert time.monotonic() - started < 5


# -- Ray's error-level line about actor restarts -----------------------------------------
FIT_ON_RAY = """
import json, os, sys, torch, dana
import ray

DRIVER, MARK, CALLS = os.getpid(), sys.argv[2] + ".died", []


def loss_fn(out, y):  # a worker's fifth loss kills its process, once in the run
    CALLS.append(1)
    if os.getpid() != DRIVER and len(CALLS) == 5 and not os.path.exists(MARK):
        open(MARK, "w").close()
        os._exit(1)
    return torch.nn.functional.cross_entropy(out, y)


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 4, generator=g)
y = (x[:, 0] > 0).long()
result = dana.fit(lambda: torch.nn.Linear(4, 2), (x, y), loss_fn=loss_fn, workers=2,
                  epochs=4, batch_size=16, lr=0.05, backend="ray", time_scale=0.004,
                  out=sys.argv[1])
dist = json.loads((result.run_dir / "dist.json").read_text())
print(json.dumps([dist["failed_run_calls"], dist["shards"][0]["applied"]]))
"""


@pytest.mark.ray
def test_fit_on_ray_logs_no_actor_restart_error_and_a_restarted_worker_rebuilds(tmp_path):
    """Ray logs at error level every actor that may restart whose constructor takes an
    object from its store (``core_worker.cc``: "constructor arguments in the object store
    and max_restarts > 0"): a worker is built from small values and fetches the user's
    problem in its first call (dana.ps.worker.Worker), also after Ray restarted it."""
    pytest.importorskip("ray")
    done = subprocess.run(
        [sys.executable, "-c", FIT_ON_RAY, str(tmp_path / "run"), str(tmp_path / "worker")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "constructor arguments in the object store" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "worker.died").exists()
    failed, applied = json.loads(done.stdout.strip().splitlines()[-1])
    # a worker died at its first push or so (its call failed), was restarted, and pushed on
    assert sum(failed) >= 1 and min(applied) >= 3, (failed, applied)


def _grpc_server(with_gcs: bool):
    """A gRPC server on 127.0.0.3 (Ray takes 127.0.0.1 for this machine's outward
    address): bare, or answering Ray's GCS ``GetClusterId`` and nothing else."""
    from concurrent import futures

    grpc = pytest.importorskip("grpc")
    pytest.importorskip("ray")
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    class Node(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):
            return gcs_service_pb2.GetClusterIdReply(cluster_id=b"\x01" * 28)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if with_gcs:
        gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Node(), server)
    port = server.add_insecure_port("127.0.0.3:0")
    server.start()
    return server, f"127.0.0.3:{port}"


def test_a_grpc_server_that_is_no_ray_gcs_is_refused_at_once(monkeypatch):
    from dana.ps import cluster

    server, address = _grpc_server(with_gcs=False)
    monkeypatch.setenv("DANA_CONNECT_TIMEOUT", "2")
    try:
        with pytest.raises(DanaError, match="is not a Ray cluster.*has no GCS service"):
            cluster._check_reachable(address)
    finally:
        server.stop(0)


def test_joining_a_gcs_where_ray_cannot_connect_ends_at_the_deadline(tmp_path):
    """A GCS that answers the probes and nothing more: Ray's own connect tried for 40 s;
    ``dana train --address`` gives up at ``DANA_CONNECT_TIMEOUT`` with status 2, the
    address named and no run directory left."""
    import time

    server, address = _grpc_server(with_gcs=True)
    out = tmp_path / "run"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dana.cli", "train", "--backend", "ray", "--address", address,
             "--workers", "2", "--dataset", "synthetic", "--model", "mlp", "--train-size", "256",
             "--test-size", "64", "--epochs", "1", "--quiet", "--out", str(out)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "DANA_CONNECT_TIMEOUT": "3"},
        )  # fmt: skip
    finally:
        server.stop(0)
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - started < 30
    assert f"could not join the Ray cluster at --address {address}" in done.stderr
    assert "did not connect within 3 s (DANA_CONNECT_TIMEOUT" in done.stderr
    assert not out.exists()
