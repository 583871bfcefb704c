#!/usr/bin/env bash
# Builds and runs the whole test suite as CI does (warnings are errors): host tests, the header
# self-containment build, the installed-package consumer, the checkpoint fuzzer (30 s), and the GPU
# tests (reported as skipped where no CUDA device is); then the host tests and the simulated-device tests
# under ASan + UBSan with the library's line coverage (tests/coverage.sh), and the pipeline and
# simulated-device tests under TSan (CMakePresets.json: sanitize, tsan). Installs what the build needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
cmake --workflow --preset ci
bash tests/coverage.sh  # the sanitize workflow, then the library's line coverage on the host
cmake --workflow --preset tsan
