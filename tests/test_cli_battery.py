"""The battery of malformed inputs: each is refused with exit status 2, a ``dana: error:``
line naming the problem (and the file), no traceback, and no run directory left behind
(the real command, forked from tests/clirun.py's helper)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import run_dana

SMALL = {"--dataset": "synthetic", "--model": "linear", "--train-size": "256",
         "--test-size": "64", "--batch-size": "32", "--workers": "2", "--epochs": "1"}  # fmt: skip


def train_args(given: list[str]) -> list[str]:
    """SMALL's options but those ``given`` (a --config file gives its own), then ``given``."""
    flags = set(given)
    if "--config" in flags:
        flags |= {"--workers", "--epochs", "--batch-size", "--train-size"}
    base = [x for k, v in SMALL.items() if k not in flags for x in (k, v)]
    return ["train", *base, "--quiet", *given]


def refused(result, *fragments: str) -> str:
    """The ``dana: error:`` text, after checking the refusal's form."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("dana: error:")]
    assert lines, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return "\n".join(lines)


BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 8

# (id, file name, its bytes or text, the fragments of the message)
FILES = [
    ("config-binary-yaml", "bad.yaml", BINARY, ["not a text file", "YAML or JSON"]),
    ("config-binary-json", "bad.json", BINARY, ["not a text file"]),
    ("config-list", "list.yaml", "- 1\n- 2\n", ["mapping of option: value", "got a list"]),
    ("config-scalar-json", "s.json", "3", ["mapping of option: value", "got a int"]),
    ("config-int-key", "k.yaml", "1: 2\n", ["1 is not an option name"]),
    ("config-syntax", "syn.yaml", "workers: [\n", ["not valid YAML"]),
    ("config-tag", "tag.yaml", "workers: !!python/object/apply:os.system [ls]\n", ["not valid YAML"]),
    ("json-workers-1e400", "w.json", '{"workers": 1e400}', ["--workers must be an integer", "inf"]),
    ("json-epochs-1e30", "e.json", f'{{"epochs": {10**30}}}', ["--epochs must be a number"]),
    ("yaml-workers-1e30", "w.yaml", f"workers: {10**30}\n", ["--workers", "64 bits"]),
    ("json-batch-1e20", "b.json", f'{{"batch_size": {10**20}}}', ["--batch-size", "64 bits"]),
    ("json-staleness-1e30", "st.json", f'{{"max_staleness": {10**30}}}', ["--max-staleness", "64 bits"]),
    ("trace-path-int", "tp.yaml", "timing: trace\ntiming_params: {path: 5}\n", ["path must be a file name"]),
    ("json-lr-401-digits", "lr.json", f'{{"lr": {10**400}}}', ["--lr must be a number > 0"]),
    ("yaml-nested-5000", "bad-nested.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", ["nested more than 100"]),
    ("json-nested-5000", "bad-nested.json", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", ["nested more than 100"]),
    ("yaml-alias-in-itself", "bad-loop.yaml", "timing_params: &x {a: *x}\n", ["alias inside itself"]),
]  # fmt: skip


@pytest.mark.parametrize("name, data, fragments", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_bad_config_file(tmp_path: Path, name: str, data, fragments: list[str]) -> None:
    path = tmp_path / name
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    out = tmp_path / "run"
    message = refused(run_dana(*train_args(["--config", str(path), "--out", str(out)])), *fragments)
    if name.startswith(("bad", "list", "s.j", "k.", "syn", "tag")):
        assert str(path) in message  # the dana: error: line names the file
    assert not out.exists()


@pytest.mark.parametrize("kind", ["cluster", "sweep"])
def test_binary_cluster_and_sweep_files(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(BINARY)
    out = tmp_path / "out"
    if kind == "cluster":
        args = train_args(["--cluster", str(path), "--out", str(out)])
    else:
        args = ["sweep", "--config", str(path), "--out", str(out)]
    message = refused(run_dana(*args), "not a text file")
    assert str(path) in message
    assert not out.exists()


@pytest.mark.parametrize("text", ["[1, 2]\n", "\xff\x00"], ids=["list", "binary"])
def test_resume_of_a_config_that_is_no_mapping(tmp_path: Path, text: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes(text.encode("latin-1"))
    refused(run_dana("train", "--resume", str(run)), str(run / "config.json"))
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]


DEPENDENT = [
    ("address-without-ray", ["--address", "127.0.0.1:1"], ["--address", "--backend ray"]),
    ("no-standby-in-sim", ["--no-standby"], ["--no-standby", "--backend ray"]),
    ("time-scale-in-sim", ["--time-scale", "0.001"], ["--time-scale", "--backend ray"]),
    ("servers-without-cluster", ["--servers", "2", "--algorithm", "asgd"], ["--servers", "--cluster"]),
    ("experiment-without-mlflow", ["--mlflow-experiment", "x"], ["--mlflow-experiment", "--mlflow"]),
    ("data-dir-of-synthetic", ["--data-dir", "."], ["--data-dir", "reads no files"]),
    ("relay-log-bytes-in-sim", ["--relay-log-bytes", "1000"], ["--relay-log-bytes 1000", "--backend ray"]),
    ("server-timeout-in-sim", ["--server-timeout", "5"], ["--server-timeout 5.0", "--backend ray"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "args, fragments", [c[1:] for c in DEPENDENT], ids=[c[0] for c in DEPENDENT]
)
def test_option_that_needs_another_is_refused(tmp_path: Path, args, fragments) -> None:
    """An option that means something only with another is refused, never ignored."""
    out = tmp_path / "run"
    refused(run_dana(*train_args([*args, "--out", str(out)])), *fragments, "drop")
    assert not out.exists()


def test_huge_sizes_are_refused_before_allocating(tmp_path: Path) -> None:
    """A size that implies hundreds of GB is refused at once, naming the figure."""
    import torch

    cases = [
        (["--train-size", str(10**11)], ["--dataset synthetic", "GiB", "--train-size"]),
        (["--model", "wrn-16-100000"], ["--model wrn-16-100000", "parameters", "GiB"]),
    ]
    data = tmp_path / "tensors"
    data.mkdir()
    labels = torch.zeros(8, dtype=torch.long)
    labels[-1] = 10**11  # a corrupt label: 10**11 classes
    torch.save({"x": torch.zeros(8, 1, 4, 4), "y": labels}, data / "train.pt")
    torch.save(
        {"x": torch.zeros(8, 1, 4, 4), "y": torch.zeros(8, dtype=torch.long)}, data / "test.pt"
    )
    tensors = ["--dataset", "tensors", "--data-dir", str(data), "--train-size", "8",
               "--test-size", "8", "--batch-size", "2"]  # fmt: skip
    cases.append((tensors, ["100,000,000,001 classes", "GiB"]))
    for args, fragments in cases:
        out = tmp_path / "run"
        refused(run_dana(*train_args([*args, "--out", str(out)]), timeout=60), *fragments)
        assert not out.exists()


def _reader_case(tmp_path: Path, kind: str) -> tuple[list[str], list[str]]:
    """A malformed file of each reader, the options that read it, the message's fragments."""
    import torch

    if kind == "idx-truncated":
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):  # fmt: skip
            (tmp_path / name).write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x10" + b"\x00" * 5)
        return ["--dataset", "mnist", "--data-dir", str(tmp_path)], ["truncated"]
    if kind == "cifar-truncated":
        folder = tmp_path / "cifar-10-batches-bin"
        folder.mkdir()
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            (folder / name).write_bytes(b"\x01" * 1000)
        return ["--dataset", "cifar10", "--data-dir", str(tmp_path)], [
            "data_batch_1.bin",
            "record size",
        ]
    if kind == "tensors-garbage":
        (tmp_path / "train.pt").write_bytes(b"garbage")
        (tmp_path / "test.pt").write_bytes(b"garbage")
        return ["--dataset", "tensors", "--data-dir", str(tmp_path)], ["train.pt", "not a readable"]
    if kind == "tensors-nan":
        x = torch.zeros(8, 1, 4, 4)
        x[0, 0, 0, 0] = float("nan")
        torch.save({"x": x, "y": torch.zeros(8, dtype=torch.long)}, tmp_path / "train.pt")
        torch.save(
            {"x": torch.zeros(8, 1, 4, 4), "y": torch.zeros(8, dtype=torch.long)},
            tmp_path / "test.pt",
        )
        return ["--dataset", "tensors", "--data-dir", str(tmp_path), "--train-size", "8",
                "--test-size", "8", "--batch-size", "2"], ["NaN"]  # fmt: skip
    if kind == "text-empty":
        (tmp_path / "empty.txt").write_text("")
        return ["--dataset", "text", "--data-dir", str(tmp_path / "empty.txt"),
                "--model", "transformer-tiny"], ["0 bytes", "longer text"]  # fmt: skip
    trace = tmp_path / "trace.csv"
    texts = {"trace-binary": b"\x00\xff\x80" * 30, "trace-header": b"0,1\n1,2\n",
             "trace-negative": b"worker,duration\n0,-1\n1,2\n"}  # fmt: skip
    trace.write_bytes(texts[kind])
    fragment = {
        "trace-binary": "not a text",
        "trace-header": "header",
        "trace-negative": "positive",
    }
    return ["--timing", "trace", "--timing-trace", str(trace)], [fragment[kind]]


READERS = ["idx-truncated", "cifar-truncated", "tensors-garbage", "tensors-nan", "text-empty",
           "trace-binary", "trace-header", "trace-negative"]  # fmt: skip


@pytest.mark.parametrize("kind", READERS)
def test_malformed_data_file(tmp_path: Path, kind: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    args, fragments = _reader_case(data, kind)
    out = tmp_path / "run"
    refused(run_dana(*train_args([*args, "--out", str(out)])), *fragments)
    assert not out.exists()


def test_truncated_checkpoint_is_refused_and_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = train_args(["--checkpoint-every", "1", "--out", str(run)])
    assert run_dana(*args).returncode == 0
    (run / "summary.json").unlink()
    whole = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(whole[:200])
    refused(run_dana("train", "--resume", str(run)), "checkpoint.pt", "unreadable checkpoint")
    assert (run / "checkpoint.pt").read_bytes() == whole[:200]


@pytest.mark.parametrize("text", ["[1]", "{", "\xff"], ids=["list", "cut", "binary"])
def test_report_and_resume_of_a_corrupt_summary(tmp_path: Path, text: str) -> None:
    """A summary.json that is no mapping: the report shows the run as not finished, and
    --resume names the file (no traceback either way)."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"algorithm": "asgd", "workers": 2, "seed": 0}')
    (run / "metrics.csv").write_text("epoch,updates\n0,0\n")
    (run / "summary.json").write_bytes(text.encode("latin-1"))
    result = run_dana("report", str(tmp_path), "--out", str(tmp_path / "report"))
    assert "Traceback" not in result.stderr, result.stderr
    refused(run_dana("train", "--resume", str(run)), str(run / "summary.json"))
