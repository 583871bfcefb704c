#!/usr/bin/env bash
# Builds and runs the whole test suite as CI does (warnings are errors): host tests, the header
# self-containment build, the installed-package consumer, the checkpoint fuzzer (30 s), and the GPU
# tests (reported as skipped where no CUDA device is); then the host tests under ASan + UBSan and the
# pipeline tests under TSan (CMakePresets.json: sanitize, tsan). Installs what the build needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
cmake --workflow --preset ci
cmake --workflow --preset sanitize
cmake --workflow --preset tsan
