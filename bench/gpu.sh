#!/usr/bin/env bash
# The GPU checks, in one short run (under 5 minutes): the CUDA exactness and end-to-end
# checks, then the simulator's scale benchmark on cuda (its table and last line).
# Runs from a checkout with the machine's python3 and nothing installed (pytest is used
# where it is there; the same checks run without it):
#   bash bench/gpu.sh
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"

echo "== CUDA checks"
if python3 -c "import pytest" 2>/dev/null; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sim_engines.py -k cuda -rs 2>&1 | tail -15
else
    timeout 150 python3 - <<'EOF'
import tempfile, time
from pathlib import Path

import torch

import dana
from dana.train.config import TrainConfig
from dana.train.runner import train

assert torch.cuda.is_available(), "no CUDA device"


def run(algorithm, **kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 8, 8, generator=g, dtype=torch.float64)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(144, 2)).double()
    return dana.simulate(model, x, y, algorithm=algorithm, workers=8, lr=0.05, epochs=2,
                         batch_size=16, device="cuda", **kw).simulator


for algorithm in ["dana-slim", "dana-zero", "nag-asgd", "asgd", "gap-aware"]:
    seq, bat = run(algorithm), run(algorithm, batch_workers=8)
    same = seq.log.numpy()["worker"].tolist() == bat.log.numpy()["worker"].tolist()
    diff = (seq.params() - bat.params()).abs().max().item()
    ok = same and diff <= 1e-10 and seq.params().device.type == "cuda"
    print(f"{'PASS' if ok else 'FAIL'} cuda batched == sequential, {algorithm}: "
          f"same events {same}, max |diff| {diff:.2e}")
with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    config = TrainConfig(dataset="synthetic", model="cnn", train_size=512, test_size=128,
                         batch_size=32, workers=8, epochs=1, device="cuda",
                         batch_workers="auto")
    summary = train(config, Path(tmp) / "run", progress=False)
    ok = summary["pushes"] > 0 and summary["final_test_error"] < 1
    print(f"{'PASS' if ok else 'FAIL'} dana train --device cuda --batch-workers auto: "
          f"{summary['pushes']} pushes, test error {summary['final_test_error']:.3f}, "
          f"{time.perf_counter() - start:.1f} s")
EOF
fi

echo "== bench/sim_scale.py --device cuda"
timeout 170 python3 bench/sim_scale.py --device cuda --models cnn --gpu-models cnn,resnet20 \
    --cpu-skip "sync,sim batched" --seconds 3 --repeats 2
