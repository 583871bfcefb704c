#!/usr/bin/env bash
# The main job: builds and runs the training program (examples/train.cpp) — an MLP (or, with --model
# cnn, the tutorial's CNN) on Fashion-MNIST across host towers. Arguments go to the program (--help
# lists them). Installs what it needs when
# missing, the data set (Debian's dataset-fashion-mnist) included; where the data set cannot be
# installed it says so and trains on a GENERATED data set of the same shape instead.
set -euo pipefail
cd "$(dirname "$0")/.."
data=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
bash cmake/install-deps.sh dataset-fashion-mnist || bash cmake/install-deps.sh
extra=()
if [ ! -f "$data" ] && [[ " $* " != *" --data "* && " $* " != *" --generated "* ]]; then
  echo "run.sh: Fashion-MNIST is not installed and could not be (Debian package dataset-fashion-mnist);" \
       "training on a GENERATED data set instead" >&2
  extra=(--generated 60000)
fi
cmake --preset default >/dev/null
cmake --build --preset default --target train
# OpenBLAS picks its kernel when it loads; where it took one with narrower vectors than the CPU has
# (Debian 12's OpenBLAS on recent Intel Xeons: Prescott, 2.7x slower), the program names the right one.
# An OPENBLAS_CORETYPE already set is the user's choice and is kept (train says if another is faster).
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$(build/default/examples/train --openblas-core)
  if [ -n "$core" ]; then
    echo "run.sh: OpenBLAS took a kernel with narrower vectors than this CPU has; running with OPENBLAS_CORETYPE=$core" \
         "(set OPENBLAS_CORETYPE yourself to choose another)" >&2
    export OPENBLAS_CORETYPE=$core
  fi
fi
exec build/default/examples/train "${extra[@]}" "$@"
