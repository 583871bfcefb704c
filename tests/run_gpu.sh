#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device. Phases, in order (PHASES to choose,
# default all of them):
#   build     configure and build for sm_90 (ARCH to change) in build/gpu, with NCCL and cuDNN where the
#             toolkit or PyTorch's wheel folders have them
#   test      the GPU-side tests through ctest (gpu.*, cuda.*, examples.train_program, train_ranks and
#             minimal_cuda; the host suite is CI's) (a GPU test that skips where nvidia-smi lists a GPU fails;
#             examples.train_program runs its GPU block only), the backends at 9-16 towers, then
#             reduce::sharded across processes with GPU towers under mpirun (MPI staged through host
#             memory, and NCCL where the build has it)
#   sanitize  the GPU tests under compute-sanitizer memcheck and racecheck (2 towers, time-limited), and
#             memcheck of reduce::sharded across processes (one rank, staged)
#   bench     the benchmarks (BENCH=quick for the quick subset), the PyTorch anchors where .device/anchors
#             holds them, and table.md: the results table with every target checked
#   train     the training program on GPU towers: --compare-backends (every backend and layout, one
#             table, equal checksums) for the MLP at 1, 2 and 4 towers and for the CNN (cuDNN) at 2,
#             timelines of p2p_tree, sharded and host, and train --ranks --backend sharded over MPI (two
#             processes, staged) and NCCL (one process) (Fashion-MNIST where .device/fashion-mnist holds
#             its .gz files; 2 epochs of the MLP with BENCH=quick, else 15; the CNN: 1 epoch, else 3)
# DRY_RUN=1 prints each phase's steps and budgets without running anything (no GPU needed).
#
# Time. The device tool allows 10 minutes a command and 15 minutes of device time in all, and keeps
# build outputs between calls on a warm machine, so a first call runs PHASES="build test sanitize" and a
# second PHASES="bench train". Each phase prints its wall time against its budget and the run stops at
# once, with a FAILED line, when a phase overruns (CALL_BUDGET, default 570 s, bounds a call's phases).
# Estimate (2026-12-02), from CPU-seconds measured for sm_90 on the loaded 2-core dev machine with
# cmake/time-compile.sh: the GPU-test units 35-59 s each (516 s in all), train's 13 units 17-58 s (~690
# s), the GPU benchmark's 5 units 18-49 s (184 s) and the GPU MPI test's 4 units 39-52 s (175 s; 89
# and 86 s as one unit each before the split), minimal_cuda 30 s, the 13 CUDA header units ~75 s, the
# host units a few hundred: ~1900 CPU-s. On 16 cores ~120 s of compiling with no unit above 60 s on
# the tail, ~20 s of linking, ~25 s of configure: build
# ~2.5 min (budget 300 s; seconds on a warm machine). test: ctest -j 8 of the GPU-side tests ~1.5 min
# (the GPU tests ~1 min on the H200: 5.6 s at b1e23f7, the suite ~10x since; examples.train_ranks ~30 s;
# examples.train_program two short GPU trainings), many_towers (9-16 only) ~1 min, the MPI GPU steps
# ~30 s: ~3 min (budget 300 s). sanitize: memcheck and racecheck on subsets, limits 120 + 60 + 60 s:
# ~2.5 min (budget 270 s). First call: ~8 min expected on a cold machine, ~5.5 on a warm one (build
# kept); if the build phase alone took more than 4 minutes, run sanitize in a call of its own. Second
# call: the benchmark ~2.5 min full (40 s quick; 2026-11-30's full run), the trainings ~3 min (15 epochs
# of the MLP, ~250k examples/s per run on 2026-11-30, x backends x 3 tower counts, the CNN, two --ranks
# runs): ~5.5 min (budgets 240 + 300 s).
# Writes under $OUT (default build/gpu-results): summary.txt, the JSON files, table.md, logs.tar.gz.
# Catch2 comes from the system, or from a Debian catch2_*.deb placed in .device/ (unpacked to /tmp/c2).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
out=${OUT:-$PWD/build/gpu-results}
phases=" ${PHASES:-build test sanitize bench train} "
bench=${BENCH:-full}
mkdir -p "$out"

dry=${DRY_RUN:-0}
status=0
phase_name=""
phase_started=0
phase_deadline=0
phase_budget=0
# phase NAME BUDGET_SECONDS: starts a phase (ending the one before); its steps must end within the budget.
# A call's own budget (CALL_BUDGET, default 570 s: the device tool stops a command at 600 s) bounds every
# phase's too, so that an overrun ends the call with its logs and summary written rather than killed.
call_deadline=${CALL_BUDGET:-570}
phase() {
  end_phase
  phase_name=$1 phase_budget=$2 phase_started=$SECONDS phase_deadline=$((SECONDS + $2))
  if [ $phase_deadline -gt $call_deadline ]; then
    phase_deadline=$call_deadline
    phase_budget=$((call_deadline - SECONDS))
  fi
  echo "phase $phase_name: budget ${phase_budget}s" | tee -a "$out/summary.txt"
}
end_phase() {
  [ -n "$phase_name" ] || return 0
  printf 'phase %s: %ds of its %ds budget\n' "$phase_name" "$((SECONDS - phase_started))" "$phase_budget" | tee -a "$out/summary.txt"
  phase_name=""
}
overrun() {  # the phase's budget is spent: stop the whole run here
  printf 'FAILED: phase %s overran its budget of %ds (%s)\n' "$phase_name" "$phase_budget" "$1" | tee -a "$out/summary.txt"
  status=1
  finish
}
step() {  # step NAME COMMAND...: runs within what is left of the phase's budget, logs to $out/NAME.log, records the outcome
  local name=$1; shift
  if [ "$dry" = 1 ]; then
    printf '  %-18s %s\n' "$name" "$*"
    return 0
  fi
  local left=$((phase_deadline - SECONDS))
  [ $left -gt 0 ] || overrun "before step $name"
  local start=$SECONDS
  timeout --kill-after=10 "$left" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  printf '%-18s rc=%d  %4ds  %s\n' "$name" "$rc" "$((SECONDS - start))" "$(tail -n 1 "$out/$name.log")" | tee -a "$out/summary.txt"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ] && [ $SECONDS -ge $phase_deadline ]; then overrun "step $name stopped"; fi
  [ $rc -eq 0 ] || status=1
  return $rc
}
# expect NAME REGEX: the step's log must hold a line matching REGEX (grep -E).
expect() {
  [ "$dry" = 1 ] && { printf '  %-18s log must match: %s\n' "" "$2"; return 0; }
  grep -qE "$2" "$out/$1.log" && return 0
  echo "FAILED: $1: no line matching '$2'" | tee -a "$out/summary.txt"
  status=1
}
note() { echo "$*" | tee -a "$out/summary.txt"; }
wanted() { [[ "$phases" == *" $1 "* ]]; }
finish() {
  end_phase
  [ "$dry" = 1 ] || (cd "$out" && tar czf logs.tar.gz ./*.log 2>/dev/null && rm -f ./*.log)
  echo "run_gpu.sh: $([ $status -eq 0 ] && echo passed || echo FAILED) in ${SECONDS}s" | tee -a "$out/summary.txt"
  exit $status
}

: >"$out/summary.txt"
if [ "$dry" = 1 ]; then
  echo "DRY_RUN: the plan of phases:$phases (nothing runs)"
else
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >>"$out/summary.txt" 2>&1
fi
echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown); phases:$phases; BENCH=$bench" >>"$out/summary.txt"

# What the build found: NCCL (CMakeCache), and the mpirun command CTest uses (build/gpu/mpirun_flags.txt:
# --mca btl_vader_single_copy_mechanism none, which containers without ptrace need for two ranks).
build_has_nccl() {
  grep -q '^TOWERPIPE_ENABLE_NCCL:BOOL=ON' build/gpu/CMakeCache.txt 2>/dev/null &&
    grep -q '^TOWERPIPE_NCCL_LIBRARY:FILEPATH=/' build/gpu/CMakeCache.txt && grep -q '^TOWERPIPE_NCCL_INCLUDE:PATH=/' build/gpu/CMakeCache.txt
}
mpirun=()
read_mpirun() {
  mpirun=()
  [ -f build/gpu/mpirun_flags.txt ] && mapfile -t mpirun <build/gpu/mpirun_flags.txt
  [ "$dry" = 1 ] && [ ${#mpirun[@]} -eq 0 ] && mpirun=(mpirun "<flags from build/gpu/mpirun_flags.txt>")
  return 0
}

if wanted build; then
  phase build 300
  prefix=()
  if compgen -G ".device/catch2_*.deb" >/dev/null; then
    dpkg -x .device/catch2_*.deb /tmp/c2 && prefix=(-DCMAKE_PREFIX_PATH=/tmp/c2/usr)
  fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # cuDNN for the CNN's GPU towers and NCCL for --transport nccl: PyTorch's wheel folders where the
  # toolkit has none (lib/libcudnn.so.9, lib/libnccl.so.2: no unversioned names; CMake looks for those).
  for cudnn in /usr/local/cuda /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn; do
    if [ -f "$cudnn/include/cudnn.h" ]; then
      prefix+=(-DCUDNN_ROOT="$cudnn")
      break
    fi
  done
  for nccl in /usr/local/cuda /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl; do
    if [ -f "$nccl/include/nccl.h" ]; then
      prefix+=(-DNCCL_ROOT="$nccl")
      break
    fi
  done
  step configure cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" "${prefix[@]}" || finish
  step build cmake --build build/gpu -j "$(nproc)" || finish
fi
if [ "$dry" != 1 ] && [ ! -x build/gpu/tests/towerpipe_gpu_tests ]; then
  note "no build in build/gpu: run the build phase"
  status=1
  finish
fi
read_mpirun
# Where MPI was found (mpirun_flags.txt written), the GPU MPI tests must have been built: they need no NCCL.
gpu_mpi=build/gpu/tests/towerpipe_gpu_mpi_tests
if [ "$dry" != 1 ] && [ ${#mpirun[@]} -gt 0 ] && [ ! -x $gpu_mpi ]; then
  note "FAILED: MPI was found but $gpu_mpi was not built"
  status=1
fi
if [ "$dry" != 1 ] && ! build_has_nccl; then
  note "note: the build has no NCCL (none found, or TOWERPIPE_ENABLE_NCCL=OFF): the NCCL steps are skipped"
fi
nccl_steps() { [ "$dry" = 1 ] || build_has_nccl; }

if wanted test; then
  phase test 300
  # The GPU-side tests only: the host suite is CI's (tests/run.sh), not the device's time.
  step ctest ctest --test-dir build/gpu --output-on-failure -j 8 \
    -R '^(gpu|cuda|examples\.(train_program|train_ranks|minimal_cuda)|structure\.nccl)'

  [ "$dry" = 1 ] || grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout" "$out/ctest.log" >>"$out/summary.txt"
  # A GPU test that skips on a machine that lists a GPU hides a broken driver or runtime: a failure.
  if [ "$dry" != 1 ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU' && grep -E "gpu\.[a-z_]+ .*(Skipped|Not Run)" "$out/ctest.log" >>"$out/summary.txt"; then
    note "FAILED: nvidia-smi lists a GPU, yet GPU tests were skipped"
    status=1
  fi
  # 9 to 16 towers (1 to 8 ran in ctest): the kernels whose tower count is a run-time value, on every
  # backend, direct and copied.
  step many_towers env TOWERPIPE_TEST_MIN_TOWERS=9 TOWERPIPE_TEST_MAX_TOWERS=16 build/gpu/tests/towerpipe_gpu_tests "[backends],[copies]"
  # reduce::sharded with GPU towers across processes, against one process bitwise: two ranks sharing the
  # GPU through pinned host memory (L = 2: partials; L = 3: every tower's product), NCCL with one rank
  # (NCCL refuses two ranks on one GPU), the towers' buffers copied (as without peer access), and a
  # mismatched rank refused on both, and two ranks that stop agreeing failing together (staged: NCCL's
  # one rank cannot disagree with itself).
  if [ ${#mpirun[@]} -gt 0 ]; then
    step mpi_gpu_staged "${mpirun[@]}" -np 2 $gpu_mpi equal 2
    step mpi_gpu_staged_l3 "${mpirun[@]}" -np 2 $gpu_mpi equal 3
    if nccl_steps; then
      step mpi_gpu_nccl "${mpirun[@]}" -np 1 $gpu_mpi nccl 4
    else
      note "mpi_gpu_nccl       skipped: the build has no NCCL"
    fi
    step mpi_gpu_copied "${mpirun[@]}" -np 2 $gpu_mpi copied 2
    step mpi_gpu_mismatch "${mpirun[@]}" -np 2 $gpu_mpi mismatch
    step mpi_gpu_disagree "${mpirun[@]}" -np 2 $gpu_mpi disagree
  else
    note "FAILED: no MPI found by the build (build/gpu/mpirun_flags.txt): the GPU-across-processes steps cannot run"
    status=1
  fi
fi

if wanted sanitize; then
  phase sanitize 270
  # The sanitizers slow kernels down by orders of magnitude: fewer towers, and a time limit each.
  export TOWERPIPE_TEST_MAX_TOWERS=2
  # memcheck: every GPU test but the repeats of the same kernels over more options (fp32 backends'
  # optimizers and layouts, buckets, 16-bit towers, steps' options, staging, errors, checkpoints);
  # racecheck: the fp32 backends.
  step memcheck timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests \
    "[backends]~[automatic],[steps],[staging],[errors],[checkpoint]"
  step racecheck timeout 60 compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu/tests/towerpipe_gpu_tests \
    "[backends]~[overlap]~[automatic]"
  if [ ${#mpirun[@]} -gt 0 ]; then  # the across-processes kernels, one rank, staged
    step memcheck_mpi timeout 60 "${mpirun[@]}" -np 1 compute-sanitizer --tool memcheck --error-exitcode 1 $gpu_mpi equal 2
  fi
  [ "$dry" = 1 ] || grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out"/memcheck*.log "$out/racecheck.log" >>"$out/summary.txt"
  unset TOWERPIPE_TEST_MAX_TOWERS
fi

if wanted bench; then
  phase bench 240
  quick=(); [ "$bench" = quick ] && quick=(--quick)
  step gpu_bench build/gpu/benchmarks/towerpipe_gpu_benchmark "${quick[@]}" --out "$out/gpu_benchmark.json"
  step host_bench build/gpu/benchmarks/towerpipe_host_benchmark "${quick[@]}" --out "$out/host_benchmark.json"
  if [ -f .device/anchors/torch_anchor_bench.py ]; then
    step anchors env OUT="$out" python3 .device/anchors/torch_anchor_bench.py
    step transfers python3 .device/anchors/host_transfer_bench.py  # PCIe and torch's CPU Adam: reduce::host's peers
  fi
  [ "$dry" = 1 ] || { python3 benchmarks/table.py "$out" >"$out/table.md" 2>&1 && tail -n 1 "$out/table.md" >>"$out/summary.txt"; }
fi

if wanted train; then
  phase train 300
  # The main job on GPU towers: the backends compared on the same training, per tower count.
  data=(--generated 60000)
  [ -f .device/fashion-mnist/train-images-idx3-ubyte.gz ] && data=(--data .device/fashion-mnist)
  epochs=15; cnn_epochs=3; [ "$bench" = quick ] && epochs=2 && cnn_epochs=1
  for cudnn in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib; do
    [ -d "$cudnn" ] && export LD_LIBRARY_PATH="$cudnn:${LD_LIBRARY_PATH:-}"
  done
  if [ "$dry" = 1 ] || [ -x build/gpu/examples/train ]; then
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
    [ "$dry" = 1 ] || grep -h -A12 '^compare:' "$out"/compare_*.log >"$out/compare.md" 2>/dev/null
    for backend in p2p_tree sharded host; do
      step "timeline_$backend" build/gpu/examples/train "${data[@]}" --epochs 1 --backend "$backend" --towers 2 \
        --timeline "$out/timeline_$backend.json" --log-every 1000000
    done
    # --ranks on GPU towers, reduce::sharded across processes (the model line must name it): two
    # processes sharing the GPU through MPI staged in pinned memory; NCCL with one process (it refuses two
    # ranks on one GPU), where the build has NCCL.
    if [ ${#mpirun[@]} -gt 0 ]; then
      step ranks_mpi "${mpirun[@]}" -np 2 build/gpu/examples/train "${data[@]}" --epochs 1 --ranks --backend sharded \
        --transport mpi --towers 2 --log-every 1000000 && expect ranks_mpi "2 GPU towers in each of 2 processes, reduce::sharded,"
      if nccl_steps; then
        step ranks_nccl "${mpirun[@]}" -np 1 build/gpu/examples/train "${data[@]}" --epochs 1 --ranks --backend sharded \
          --transport nccl --towers 2 --log-every 1000000 && expect ranks_nccl "2 GPU towers, reduce::sharded,"
      else
        note "ranks_nccl         skipped: the build has no NCCL"
      fi
    fi
  else
    note "train not built (no zlib on this machine)"
  fi
fi
finish
