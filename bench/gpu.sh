#!/usr/bin/env bash
# The GPU checks, in one short run (under 5 minutes): the CUDA exactness and end-to-end
# tests, then the simulator's scale benchmark on cuda (its table and last line).
# Runs from a checkout with the machine's python3 and nothing installed:
#   bash bench/gpu.sh
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
echo "== CUDA tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sim_engines.py -k "cuda or batched_equals" 2>&1 | tail -15
echo "== bench/sim_scale.py --device cuda"
timeout 170 python3 bench/sim_scale.py --device cuda --models cnn --gpu-models cnn,resnet20 \
    --cpu-skip "sync,sim batched" --seconds 3 --repeats 2
