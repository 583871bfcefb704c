#!/usr/bin/env bash
# Installs what building and testing towerpipe needs, where it is missing, from Debian's packages:
# cmake, g++, ninja, Catch2 2.x, clang with libFuzzer, OpenMPI (reduce::sharded across processes:
# ctest mpi.*), and for the training program zlib and OpenBLAS.
# Extra package names given as arguments are installed too (examples/run.sh asks for the data set).
# matplotlib (the plots; ctest examples.plot_metrics) comes from PyPI for the python3 on PATH, which
# need not be Debian's. The CUDA toolkit is optional (GPU tests are built where nvcc exists).
set -euo pipefail

needed=()
command -v cmake >/dev/null || needed+=(cmake)
command -v g++ >/dev/null || needed+=(g++)
command -v ninja >/dev/null || needed+=(ninja-build)
command -v pkg-config >/dev/null || needed+=(pkgconf)
[ -f /usr/lib/cmake/Catch2/Catch2Config.cmake ] || [ -f /usr/share/cmake/Catch2/Catch2Config.cmake ] || needed+=(catch2)
[ -f /usr/include/zlib.h ] || needed+=(zlib1g-dev)
dpkg -s libopenblas-dev >/dev/null 2>&1 || needed+=(libopenblas-dev)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || needed+=(libopenmpi-dev)
command -v mpirun >/dev/null || needed+=(openmpi-bin)
# clang with libFuzzer for the checkpoint fuzzer (ctest fuzz.checkpoint_reader)
command -v clang++ >/dev/null || needed+=(clang)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || needed+=(libclang-rt-14-dev)
if command -v python3 >/dev/null && ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "towerpipe: installing matplotlib from PyPI for $(command -v python3)"
  python3 -m pip install --quiet matplotlib || echo "towerpipe: no matplotlib: the plot test will be skipped" >&2
fi
for package in "$@"; do dpkg -s "$package" >/dev/null 2>&1 || needed+=("$package"); done
[ ${#needed[@]} -eq 0 ] && exit 0

echo "towerpipe: installing ${needed[*]} from Debian's packages"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null; then
  sudo="sudo"
else
  echo "towerpipe: need root (or sudo) to install: ${needed[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${needed[@]}"
