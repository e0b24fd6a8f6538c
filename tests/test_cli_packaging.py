"""The distribution: ``python -m build`` makes a wheel and an sdist that install in a fresh
virtual environment and run (the installed ``dana`` entry point's ``--help``,
``algorithms`` and ``presets``, and a tiny ``dana train`` through the console script).

The environments see the site-packages of the interpreter that runs the tests (a
``.pth`` file lists them: the user's virtual environment where the suite runs in one,
the system's otherwise; ``--system-site-packages`` would give the base interpreter's,
not the user's environment's), so that PyTorch and the other requirements are not
installed again; pip installs with ``--no-index``, so a requirement they lack fails the
test instead of being downloaded (and the environments get no pip or setuptools of their
own: the running interpreter's, which PyTorch's requirement on setuptools accepts,
install into them).
The import must then come from the environment, not from this checkout or another
installation of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _venv(path: Path) -> Path:
    """A fresh environment that sees this interpreter's site-packages after its own."""
    _run(sys.executable, "-m", "venv", "--without-pip", path, cwd=path.parent)
    (site,) = path.glob("lib/python*/site-packages")
    parents = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (site / "_tests_parent.pth").write_text("".join(f"{p}\n" for p in parents))
    return path / "bin"


#: Run in the environment's Python: where dana comes from, and the installed ``dana``
#: console script's entry point called with ``--help``, ``algorithms`` and ``presets``
#: (one process for the four facts: each start imports PyTorch, seconds on a busy machine).
PROBE = r"""
import contextlib, io, json
from importlib.metadata import entry_points

import dana

(script,) = [e for e in entry_points(group="console_scripts") if e.name == "dana"]
main = script.load()


def run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as e:  # (--help exits)
            code = e.code
    return code or 0, out.getvalue()


print(json.dumps({"where": [dana.__file__, dana.__version__], "help": run("--help"),
                  "algorithms": run("algorithms"), "presets": run("presets")}))
"""


def _check_installed(bin_dir: Path, work: Path, version: str) -> None:
    probe = json.loads(_run(bin_dir / "python", "-c", PROBE, cwd=work).stdout)
    where = probe["where"]
    assert where[0].startswith(str(bin_dir.parent)) and where[1] == version
    assert probe["help"][0] == 0 and "usage: dana" in probe["help"][1]
    assert probe["algorithms"][0] == 0 and "dana-slim" in probe["algorithms"][1]
    # The presets travel inside the package.
    assert probe["presets"][0] == 0 and "fashion-quick" in probe["presets"][1]
    # The console script itself (bin/dana) runs a tiny training.
    out = work / "run"
    _run(bin_dir / "dana", "train", "--dataset", "synthetic", "--model", "linear",
         "--train-size", "256", "--test-size", "64", "--batch-size", "32", "--epochs", "1",
         "--quiet", "--out", out, cwd=work)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 8 and not summary["diverged"]
    assert json.loads((out / "config.json").read_text())["dana_version"] == version


@pytest.mark.slow
def test_wheel_and_sdist_build_install_and_run(tmp_path):
    pytest.importorskip("build", reason="needs the build package: pip install build")
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    assert re.search(r'^name = "dana-async"$', text, flags=re.M)
    assert re.search(r'^dynamic = \["version"\]', text, flags=re.M)
    import dana

    version = dana.__version__
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    wheel = dist / f"dana_async-{version}-py3-none-any.whl"
    sdist = dist / f"dana_async-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    for name, artifact, extra in (
        ("wheel", wheel, []),
        ("sdist", sdist, ["--no-build-isolation"]),
    ):
        work = tmp_path / name
        work.mkdir()
        bin_dir = _venv(tmp_path / f"venv-{name}")
        _run(bin_dir / "python", "-m", "pip", "install", "--no-index", "--quiet", *extra,
             artifact, cwd=work)  # fmt: skip
        _check_installed(bin_dir, work, version)
