#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device. Phases, in order (PHASES to choose,
# default all of them):
#   build     configure and build for sm_90 (ARCH to change) in build/gpu
#   test      the whole test suite (host and GPU) through ctest (a GPU test that skips where nvidia-smi
#             lists a GPU fails), the backends at 9-16 towers, then reduce::sharded across processes
#             with GPU towers under mpirun (MPI staged through host memory, and NCCL)
#   sanitize  the GPU tests under compute-sanitizer memcheck and racecheck (2 towers, time-limited), and
#             memcheck of reduce::sharded across processes (one rank, staged)
#   bench     the benchmarks (BENCH=quick for the quick subset), the PyTorch anchors where .device/anchors
#             holds them, and table.md: the results table with every target checked
#   train     the training program on GPU towers: --compare-backends (every backend and layout, one
#             table, equal checksums) for the MLP at 1, 2 and 4 towers and for the CNN (cuDNN) at 2, and
#             timelines of p2p_tree, sharded and host (Fashion-MNIST where .device/fashion-mnist holds its .gz files; 2 epochs of the MLP
#             with BENCH=quick, else 15; the CNN: 1 epoch, else 3)
# The device tool allows 10 minutes a command and keeps build outputs between calls on a warm machine,
# so a first call can run PHASES="build test sanitize" and a second PHASES="bench train".
# Writes under $OUT (default build/gpu-results): summary.txt, the JSON files, table.md, logs.tar.gz.
# Catch2 comes from the system, or from a Debian catch2_*.deb placed in .device/ (unpacked to /tmp/c2).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
out=${OUT:-$PWD/build/gpu-results}
phases=" ${PHASES:-build test sanitize bench train} "
bench=${BENCH:-full}
mkdir -p "$out"

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
wanted() { [[ "$phases" == *" $1 "* ]]; }
finish() { (cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log); exit $status; }

: >"$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >>"$out/summary.txt" 2>&1
echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown); phases:$phases; BENCH=$bench" >>"$out/summary.txt"

if wanted build; then
  prefix=()
  if compgen -G ".device/catch2_*.deb" >/dev/null; then
    dpkg -x .device/catch2_*.deb /tmp/c2 && prefix=(-DCMAKE_PREFIX_PATH=/tmp/c2/usr)
  fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # cuDNN for the CNN's GPU towers: PyTorch's wheel folder where the toolkit has none.
  for cudnn in /usr/local/cuda /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn; do
    if [ -f "$cudnn/include/cudnn.h" ]; then
      prefix+=(-DCUDNN_ROOT="$cudnn")
      break
    fi
  done
  step configure cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" "${prefix[@]}" || finish
  step build cmake --build build/gpu -j "$(nproc)" || finish
fi
[ -x build/gpu/tests/towerpipe_gpu_tests ] || { echo "no build in build/gpu: run the build phase" >>"$out/summary.txt"; status=1; finish; }

if wanted test; then
  step ctest ctest --test-dir build/gpu --output-on-failure
  grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout" "$out/ctest.log" >>"$out/summary.txt"
  # A GPU test that skips on a machine that lists a GPU hides a broken driver or runtime: a failure.
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU' && grep -E "gpu\.[a-z_]+ .*(Skipped|Not Run)" "$out/ctest.log" >>"$out/summary.txt"; then
    echo "FAILED: nvidia-smi lists a GPU, yet GPU tests were skipped" >>"$out/summary.txt"
    status=1
  fi
  # 9 to 16 towers: the kernels whose tower count is a run-time value, on every backend, direct and copied.
  step many_towers env TOWERPIPE_TEST_MAX_TOWERS=16 build/gpu/tests/towerpipe_gpu_tests "[backends],[copies]"
  # reduce::sharded with GPU towers across processes, against one process bitwise: two ranks sharing the
  # GPU through pinned host memory (L = 2: partials; L = 3: every tower's product), NCCL with one rank
  # (NCCL refuses two ranks on one GPU), the towers' buffers copied (as without peer access), and a
  # mismatched rank refused on both, and two ranks that stop agreeing failing together (staged: NCCL's
  # one rank cannot disagree with itself).
  if [ -x build/gpu/tests/towerpipe_gpu_mpi_tests ]; then
    mpirun=(mpirun --allow-run-as-root --oversubscribe)
    step mpi_gpu_staged "${mpirun[@]}" -np 2 build/gpu/tests/towerpipe_gpu_mpi_tests equal 2
    step mpi_gpu_staged_l3 "${mpirun[@]}" -np 2 build/gpu/tests/towerpipe_gpu_mpi_tests equal 3
    step mpi_gpu_nccl "${mpirun[@]}" -np 1 build/gpu/tests/towerpipe_gpu_mpi_tests nccl 4
    step mpi_gpu_copied "${mpirun[@]}" -np 2 build/gpu/tests/towerpipe_gpu_mpi_tests copied 2
    step mpi_gpu_mismatch "${mpirun[@]}" -np 2 build/gpu/tests/towerpipe_gpu_mpi_tests mismatch
    step mpi_gpu_disagree "${mpirun[@]}" -np 2 build/gpu/tests/towerpipe_gpu_mpi_tests disagree
  else
    echo "towerpipe_gpu_mpi_tests not built (no MPI or no NCCL found)" >>"$out/summary.txt"
  fi
fi

if wanted sanitize; then
  # The sanitizers slow kernels down by orders of magnitude: fewer towers, and a time limit each.
  export TOWERPIPE_TEST_MAX_TOWERS=2
  step memcheck timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests
  step racecheck timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests "[backends]"
  if [ -x build/gpu/tests/towerpipe_gpu_mpi_tests ]; then  # the across-processes kernels, one rank, staged
    step memcheck_mpi timeout 180 mpirun --allow-run-as-root -np 1 compute-sanitizer --tool memcheck --error-exitcode 1 \
      build/gpu/tests/towerpipe_gpu_mpi_tests equal 2
  fi
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out"/memcheck*.log "$out/racecheck.log" >>"$out/summary.txt"
  unset TOWERPIPE_TEST_MAX_TOWERS
fi

if wanted bench; then
  quick=(); [ "$bench" = quick ] && quick=(--quick)
  step gpu_bench build/gpu/benchmarks/towerpipe_gpu_benchmark "${quick[@]}" --out "$out/gpu_benchmark.json"
  step host_bench build/gpu/benchmarks/towerpipe_host_benchmark "${quick[@]}" --out "$out/host_benchmark.json"
  if [ -f .device/anchors/torch_anchor_bench.py ]; then
    step anchors env OUT="$out" python3 .device/anchors/torch_anchor_bench.py
    step transfers python3 .device/anchors/host_transfer_bench.py  # PCIe and torch's CPU Adam: reduce::host's peers
  fi
  python3 benchmarks/table.py "$out" >"$out/table.md" 2>&1 && tail -n 1 "$out/table.md" >>"$out/summary.txt"
fi

if wanted train; then
  # The main job on GPU towers: the backends compared on the same training, per tower count.
  data=(--generated 60000)
  [ -f .device/fashion-mnist/train-images-idx3-ubyte.gz ] && data=(--data .device/fashion-mnist)
  epochs=15; cnn_epochs=3; [ "$bench" = quick ] && epochs=2 && cnn_epochs=1
  for cudnn in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib; do
    [ -d "$cudnn" ] && export LD_LIBRARY_PATH="$cudnn:${LD_LIBRARY_PATH:-}"
  done
  if [ -x build/gpu/examples/train ]; then
    for towers in 1 2 4; do
      step "compare_mlp_${towers}" build/gpu/examples/train "${data[@]}" --epochs "$epochs" --towers "$towers" \
        --compare-backends --log-every 1000000
    done
    step compare_cnn_2 build/gpu/examples/train "${data[@]}" --model cnn --epochs "$cnn_epochs" --towers 2 \
      --layout flat --compare-backends --log-every 1000000
    # 16-bit towers on every backend: the same bits from each (exit 1 if not).
    for precision in bf16 fp16; do
      step "compare_mlp_${precision}_2" build/gpu/examples/train "${data[@]}" --epochs 1 --towers 2 --precision "$precision" \
        --compare-backends --log-every 1000000
    done
    grep -h -A12 '^compare:' "$out"/compare_*.log >"$out/compare.md" 2>/dev/null
    for backend in p2p_tree sharded host; do
      step "timeline_$backend" build/gpu/examples/train "${data[@]}" --epochs 1 --backend "$backend" --towers 2 \
        --timeline "$out/timeline_$backend.json" --log-every 1000000
    done
    # --ranks on GPU towers through each transport (one process: NCCL refuses two ranks on one GPU).
    for transport in mpi nccl; do
      step "ranks_$transport" mpirun --allow-run-as-root -np 1 build/gpu/examples/train "${data[@]}" --epochs 1 --ranks \
        --transport "$transport" --towers 2 --log-every 1000000
    done
  else
    echo "train not built (no zlib on this machine)" >>"$out/summary.txt"
  fi
fi
finish
