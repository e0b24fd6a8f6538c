#!/usr/bin/env bash
# Set up dana on a fresh machine: PyTorch (the CPU build, pinned first so that no
# requirement pulls a multi-GB CUDA build), the package with its test, Ray (with the
# job server), MLflow (the light client) and W&B extras, and the default datasets
# (Fashion-MNIST, Debian package dataset-fashion-mnist; the text corpus, package fortunes).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[dev,ray,jobs,mlflow,wandb]'
# install_data PACKAGE FILE HINT: the Debian package holding FILE, unless FILE is there
install_data() {
  if [ -e "$2" ]; then return; fi
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq "$1") >/dev/null 2>&1 \
      || echo "setup: could not install $1; $3" >&2
  else
    echo "setup: $1 missing: run 'sudo apt-get install $1' or $3" >&2
  fi
}
install_data dataset-fashion-mnist /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \
  "pass --data-dir DIR holding Fashion-MNIST's four IDX files to dana train"
install_data fortunes /usr/share/games/fortunes/science \
  "pass --data-dir FILE (a text) to dana train --dataset text"
