"""Every benchmark runs, in its smoke mode (tiny sizes, seconds), so none breaks unseen.

Each script runs in a subprocess with ``--smoke`` and must exit 0 and print its last
line, the figure docs/BENCHMARKS.md records (the smoke run's number means nothing).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

#: Each benchmark and the pattern of its last line.
LAST_LINES = {
    "master_update.py": r"dana-slim ratio [\d.]+, dana-zero ratio [\d.]+",
    "sim_memory.py": r"bytes per worker-parameter [\d.]+",
    "sim_overhead.py": r"overhead ratio [\d.]+",
    "sim_scale.py": r"parallel speed-up [\d.]+",
    "train_throughput.py": r"throughput ratio [\d.]+",
    "ps_throughput.py": r"throughput vs ray example [\d.]+",
    "ray_vs_sim.py": r"staleness mean error [\d.]+%",
    "threads_under_load.py": r"default slowdown [\d.]+x \((within|OVER) 2x\)",
    "gpu_checks.py": r"checks passed (\d+) of \1",
    "chaos_soak.py": r"chaos soak: (\d+) faults, \1 survived, lost 0, doubled 0",
    "relay_log_memory.py": r"relay log peak resident MB \d+ \(bound MB \d+\)",
}
#: Arguments beside --smoke (bench/gpu.sh's GPU checks, run here on the CPU).
ARGS = {"gpu_checks.py": ["--device", "cpu"]}
NEEDS_RAY = {"ps_throughput.py", "ray_vs_sim.py", "chaos_soak.py"}

pytestmark = pytest.mark.slow


def test_every_benchmark_is_listed():
    assert {p.name for p in BENCH.glob("*.py")} == set(LAST_LINES)


def test_gpu_sh_sim_scale_arguments_run_on_the_cpu():
    """bench/gpu.sh's sim_scale.py arguments, with --device cpu: a renamed option or
    model breaks here, not first on the GPU machine."""
    line = next(x for x in (BENCH / "gpu.sh").read_text().splitlines() if "SIM_SCALE_ARGS=(" in x)
    args = shlex.split(line.split("=(", 1)[1].rsplit(")", 1)[0])
    out = subprocess.run(
        [sys.executable, str(BENCH / "sim_scale.py"), "--device", "cpu", *args, "--smoke"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert re.fullmatch(LAST_LINES["sim_scale.py"], out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, marks=[pytest.mark.ray] if name in NEEDS_RAY else [])
        for name in sorted(LAST_LINES)
    ],
)
def test_benchmark_smoke_run(script):
    if script in NEEDS_RAY:
        pytest.importorskip("ray")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", *ARGS.get(script, [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(LAST_LINES[script], last), last
