#!/usr/bin/env bash
# The GPU checks, in one short run (under 10 minutes): the CUDA exactness and end-to-end
# checks, one run's updates per second, the simulator's scale benchmark on cuda (its table
# and last line), and packed runs. Fashion-MNIST from .gpu/data (or DANA_GPU_DATA) where
# it is there.
# Runs from a checkout with the machine's python3 and nothing installed (the CUDA tests
# where pytest is there; the test suite runs the scripts and this sim_scale.py command on
# the CPU); every step's timeout together stay under the 10 minutes of one call:
#   bash bench/gpu.sh
# With OUT set (the device machine's output folder) everything printed is also kept in
# $OUT/gpu.txt, whole: the call's reply keeps only its last lines.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    exec > >(tee "$OUT/gpu.txt") 2>&1
fi
# (tests/test_bench_smoke.py reads this line: the suite runs the same arguments on the CPU)
SIM_SCALE_ARGS=(--models cnn --gpu-models cnn,resnet20 --cpu-skip "sync,sim batched")
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"

echo "== CUDA checks"
timeout 110 python3 bench/gpu_checks.py --device cuda
if python3 -c "import pytest" 2>/dev/null; then  # (no xdist there: the suite's addopts off)
    timeout 70 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs -k "cuda or gpu" \
        tests/test_sim_engines.py tests/test_sim_sync_free.py tests/test_sim_pack.py 2>&1 | tail -15
fi

echo "== bench/gpu_updates.py --device cuda (one run's updates per second: synced, sync-free, graph)"
DATA=${DANA_GPU_DATA:-.gpu/data}
timeout 120 python3 bench/gpu_updates.py --device cuda $([ -d "$DATA" ] && echo --data-dir "$DATA")

echo "== bench/sim_scale.py --device cuda"
timeout 170 python3 bench/sim_scale.py --device cuda "${SIM_SCALE_ARGS[@]}" --seconds 3 --repeats 2

echo "== bench/pack_throughput.py --device cuda --cuda-graph (runs packed into one process)"
timeout 120 python3 bench/pack_throughput.py --device cuda --runs 8 --workers 16 --train-size 5000 \
    --cuda-graph $([ -d "$DATA" ] && echo --data-dir "$DATA")
