#!/usr/bin/env bash
# Set up dana on a fresh machine: PyTorch (the CPU build, pinned first so that no
# requirement pulls a multi-GB CUDA build), the package with its test, Ray (with the
# job server) and MLflow (the light client) extras, and the default dataset
# (Fashion-MNIST, Debian package dataset-fashion-mnist).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[dev,ray,jobs,mlflow]'
if ! ls /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
      || echo "setup: could not install dataset-fashion-mnist; pass --data-dir to dana train" >&2
  else
    echo "setup: Fashion-MNIST missing: run 'sudo apt-get install dataset-fashion-mnist'" \
         "or pass --data-dir DIR holding its four IDX files" >&2
  fi
fi
