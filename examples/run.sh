#!/usr/bin/env bash
# The main job: builds the examples and runs the host training demo; arguments go to the demo
# (--help lists them). Installs what the build needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target host_training_demo
exec build/default/examples/host_training_demo "$@"
