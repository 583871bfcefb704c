#!/usr/bin/env bash
# Builds and runs the whole test suite as CI does (warnings are errors): host tests, the header
# self-containment build, the installed-package consumer, and the GPU tests (reported as skipped
# where no CUDA device is). Installs what the build needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
cmake --workflow --preset ci
