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
# train's translation units: train.cpp and train_mixed.cpp (host towers, fp32 and 16-bit), plus
# the GPU towers' units where nvcc is found (train_gpu.cu and one generated unit per optimizer and layout,
# examples/CMakeLists.txt). Measured on the 2-core dev machine, two compiles at a time (g++ 12 -O3, nvcc
# 13.0 for PTX; 2026-12-02): 76 + 73 CPU-seconds for the host ones, 15 for train_gpu.cu and 57-65 for
# each of the 12 generated ones. GPU towers are built only where a GPU is visible (nvidia-smi -L lists one), since
# without one the program trains on host towers anyway; TOWERPIPE_GPU_TOWERS=on|off decides otherwise.
gpu_towers=${TOWERPIPE_GPU_TOWERS:-}
if [ -z "$gpu_towers" ]; then
  gpu_towers=off
  if command -v nvcc >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu_towers=on; fi
fi
cmake --preset default -DTOWERPIPE_ENABLE_CUDA=$([ "$gpu_towers" = on ] && echo ON || echo OFF) >/dev/null
if [ ! -x build/default/examples/train ]; then  # the first build (later ones rebuild only what changed)
  if [ "$gpu_towers" = on ]; then
    echo "run.sh: building examples/train first (once): 15 translation units, about 15 CPU-minutes" \
         "(8 minutes on 2 idle cores; host and GPU towers)" >&2
  else
    echo "run.sh: building examples/train first (once): 2 translation units, about 2.5 CPU-minutes" \
         "(1.5 minutes on 2 idle cores; host towers only, as no GPU is visible)" >&2
  fi
fi
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
