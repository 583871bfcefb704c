#!/usr/bin/env bash
# Line coverage of the library on the host: the sanitize workflow (CMakePresets.json: host tests, the
# simulated-device tests and the MPI tests under AddressSanitizer + UndefinedBehaviorSanitizer, built with
# --coverage) runs, then gcovr reads its counts and tests/coverage_report.py prints every library header's
# executed lines and the library lines never executed on the host (the unexecuted lines of the headers a
# host build compiles, plus the code lines of those no host build compiles: the CUDA-only shells).
# LIMIT (default 1000, the aim): the most such lines allowed; above it the script fails. Measured 1366 on
# 2026-12-02; 953 on 2026-12-04 (847 of them in the CUDA-only headers). A line holding only a brace is not
# counted (gcovr --exclude-noncode-lines): gcov puts the unwinding clean-up of a function's locals there,
# run only when something throws through it (57 such lines; 1010 with them).
# Installs gcovr from PyPI where it is missing. Writes build/sanitize/coverage.json and coverage.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v gcovr >/dev/null; then
  echo "towerpipe: installing gcovr from PyPI for $(command -v python3)"
  python3 -m pip install --quiet gcovr
fi
[ "${SKIP_BUILD:-0}" = 1 ] || cmake --workflow --preset sanitize
build=build/sanitize
# Every template instantiation's counts of a line merged; exceptional branches and brace-only lines are not lines.
gcovr --root "$PWD" --filter "$PWD/include/" --exclude-directory ".*/CMakeFiles/[0-9.]+/.*" --object-directory "$build" --json "$build/coverage.json" \
  --merge-mode-functions=separate --exclude-noncode-lines --gcov-ignore-parse-errors=negative_hits.warn_once_per_file "$build" >/dev/null
ninja -C "$build" -t deps > "$build/compiled.deps"  # which headers the host build compiled
python3 tests/coverage_report.py "$build/coverage.json" --include include --deps "$build/compiled.deps" --limit "${LIMIT:-1000}" | tee "$build/coverage.txt"
