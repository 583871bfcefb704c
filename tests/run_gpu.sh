#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device (DESIGN.md §5): builds for sm_90 (ARCH to change),
# runs the whole test suite (host and GPU), runs the GPU tests under compute-sanitizer memcheck and
# racecheck, runs the benchmarks (and the PyTorch anchors where .device/anchors holds them) and the
# training program on GPU towers (Fashion-MNIST where .device/fashion-mnist holds its .gz files), and writes
# under $OUT (default build/gpu-results): summary.txt, the benchmarks' JSON, table.md (the README's
# table, targets checked) and logs.tar.gz.
# Catch2 comes from the system, or from a Debian catch2_*.deb placed in .device/ (unpacked to /tmp/c2).
# BENCH=quick runs the quick benchmark subset; BENCH=none skips them.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
out=${OUT:-$PWD/build/gpu-results}
mkdir -p "$out"
prefix=()
if compgen -G ".device/catch2_*.deb" >/dev/null; then
  dpkg -x .device/catch2_*.deb /tmp/c2 && prefix=(-DCMAKE_PREFIX_PATH=/tmp/c2/usr)
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

status=0
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, records the outcome
  local name=$1; shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  printf '%-10s rc=%d  %4ds  %s\n' "$name" "$rc" "$((SECONDS - start))" "$(tail -n 1 "$out/$name.log")" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
  return $rc
}

: >"$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >>"$out/summary.txt" 2>&1
step configure cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" "${prefix[@]}" || exit 1
step build cmake --build build/gpu -j "$(nproc)" || exit 1
step ctest ctest --test-dir build/gpu --output-on-failure
grep -E "tests passed|Skipped|Failed" "$out/ctest.log" >>"$out/summary.txt"
# The sanitizers slow kernels down by orders of magnitude: fewer towers, and a time limit each.
export TOWERPIPE_TEST_MAX_TOWERS=2
step memcheck timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests
step racecheck timeout 180 compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests "[backends]"
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/racecheck.log" >>"$out/summary.txt"
unset TOWERPIPE_TEST_MAX_TOWERS

bench=${BENCH:-full}
if [ "$bench" != none ]; then
  quick=(); [ "$bench" = quick ] && quick=(--quick)
  step gpu_bench build/gpu/benchmarks/towerpipe_gpu_benchmark "${quick[@]}" --out "$out/gpu_benchmark.json"
  step host_bench build/gpu/benchmarks/towerpipe_host_benchmark "${quick[@]}" --out "$out/host_benchmark.json"
  if [ -f .device/anchors/torch_anchor_bench.py ]; then
    step anchors env OUT="$out" python3 .device/anchors/torch_anchor_bench.py
    step transfers python3 .device/anchors/host_transfer_bench.py  # PCIe and torch's CPU Adam: reduce::host's peers
  fi
  # The README's table with every target checked, from this run's figures.
  python3 benchmarks/table.py "$out" >"$out/table.md" 2>&1 && tail -n 1 "$out/table.md" >>"$out/summary.txt"
  # The main job on GPU towers: examples/sec and step-time spread per backend and tower count.
  data=(--generated 60000)
  [ -f .device/fashion-mnist/train-images-idx3-ubyte.gz ] && data=(--data .device/fashion-mnist)
  epochs=15; [ "$bench" = quick ] && epochs=2
  [ -x build/gpu/examples/train ] || echo "train not built (no zlib on this machine)" >>"$out/summary.txt"
  [ -x build/gpu/examples/train ] && for backend in device0 p2p_tree host; do
    for towers in 1 2 4; do
      name="train_${backend}_${towers}"
      step "$name" build/gpu/examples/train "${data[@]}" --epochs "$epochs" --backend "$backend" --towers "$towers" \
        --log-every 1000000
    done
  done
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)" >>"$out/summary.txt"
fi
(cd "$out" && tar czf logs.tar.gz ./*.log && rm -f ./*.log)
exit $status
