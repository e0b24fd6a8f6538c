#!/usr/bin/env bash
# The GPU checks, in one short run (under 8 minutes): the CUDA exactness and end-to-end
# checks, the simulator's scale benchmark on cuda (its table and last line), and packed runs.
# Runs from a checkout with the machine's python3 and nothing installed (pytest is used
# where it is there; without it, bench/gpu_checks.py runs the same checks; the test
# suite runs that script and this sim_scale.py command on the CPU):
#   bash bench/gpu.sh
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.
# (tests/test_bench_smoke.py reads this line: the suite runs the same arguments on the CPU)
SIM_SCALE_ARGS=(--models cnn --gpu-models cnn,resnet20 --cpu-skip "sync,sim batched")
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"

echo "== CUDA checks"
if python3 -c "import pytest" 2>/dev/null; then
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sim_engines.py -k cuda -rs 2>&1 | tail -15
else
    timeout 150 python3 bench/gpu_checks.py --device cuda
fi

echo "== bench/sim_scale.py --device cuda"
timeout 170 python3 bench/sim_scale.py --device cuda "${SIM_SCALE_ARGS[@]}" --seconds 3 --repeats 2

echo "== bench/pack_throughput.py --device cuda (runs packed into one process)"
timeout 150 python3 bench/pack_throughput.py --device cuda --runs 8 --workers 16 --train-size 5000
