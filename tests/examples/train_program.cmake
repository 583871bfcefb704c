# The training program end to end, on GENERATED data (CI has no Fashion-MNIST): it trains, every
# optimizer x layout x precision runs, 16-bit towers (--precision bf16, fp16) train and agree across
# backends bitwise, bad flags and files give a one-line error and a non-zero exit, the
# timeline holds every stage of every step, the gradient buckets reduced during the towers change no
# bit (--no-overlap), and resuming from a checkpoint ends bitwise where the uninterrupted run ends — on
# host towers. Where a GPU is visible, only the GPU block runs (two short trainings on GPU towers).
# Run as: cmake -DTRAIN=<path> -DWORK=<dir> -P train_program.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(small --generated 600 --batch-size 40 --log-every 1000)

# Every run but those of the GPU block trains host towers (--cpu-towers), whatever the machine: their
# assertions (the blas: line, timeline event counts, host-only backends) are about host towers.
function(run_train out_var expected_status)
  run_train_on(${out_var} ${expected_status} --cpu-towers ${ARGN})
  set(${out_var} "${${out_var}}" PARENT_SCOPE)
endfunction()
# A run on whatever towers the machine offers: GPU towers where a GPU is visible.
function(run_train_on out_var expected_status)
  execute_process(COMMAND ${TRAIN} ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
  if(NOT status STREQUAL expected_status)
    message(FATAL_ERROR "train ${ARGN}: exit ${status}, expected ${expected_status}\n${output}\n${errors}")
  endif()
  set(${out_var} "${output}${errors}" PARENT_SCOPE)
endfunction()

function(final_field output regex out_var)
  if(NOT output MATCHES "${regex}")
    message(FATAL_ERROR "no match for '${regex}' in:\n${output}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# A time of a Chrome trace as string(JSON) reads it (microseconds, "5890.5299999999997") in whole
# microseconds.
function(whole_microseconds text out_var)
  if(NOT text MATCHES "^([0-9]+)(\\.[0-9]*)?$")
    message(FATAL_ERROR "timeline: '${text}' is not a time")
  endif()
  set(${out_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

# Whether a span of row "reduce (during towers)" in a Chrome trace begins inside a span of a tower row
# of the same step: a gradient bucket reduced while a tower still computed.
function(bucket_inside_towers trace_file out_var)
  file(READ ${trace_file} trace)
  string(JSON count LENGTH "${trace}" traceEvents)
  math(EXPR last "${count} - 1")
  set(tower_tids "")
  set(towers "")   # "step:begin:end" of every tower span
  set(buckets "")  # "step:begin" of every bucket span
  foreach(i RANGE ${last})
    string(JSON kind GET "${trace}" traceEvents ${i} ph)
    string(JSON tid GET "${trace}" traceEvents ${i} tid)
    string(JSON name GET "${trace}" traceEvents ${i} name)
    if(kind STREQUAL "M" AND name STREQUAL "thread_name")
      string(JSON row GET "${trace}" traceEvents ${i} args name)
      if(row MATCHES "^tower [0-9]+$")
        list(APPEND tower_tids ${tid})
      elseif(row STREQUAL "reduce (during towers)")
        set(bucket_tid ${tid})
      endif()
    elseif(kind STREQUAL "X")
      string(JSON step GET "${trace}" traceEvents ${i} args step)
      string(JSON ts GET "${trace}" traceEvents ${i} ts)
      whole_microseconds(${ts} begin)
      list(FIND tower_tids ${tid} tower)
      if(tower GREATER -1)
        string(JSON dur GET "${trace}" traceEvents ${i} dur)
        whole_microseconds(${dur} length)
        math(EXPR end "${begin} + ${length} + 1")
        list(APPEND towers "${step}:${begin}:${end}")
      elseif(DEFINED bucket_tid AND tid EQUAL bucket_tid)
        list(APPEND buckets "${step}:${begin}")
      endif()
    endif()
  endforeach()
  foreach(bucket IN LISTS buckets)
    string(REPLACE ":" ";" b "${bucket}")
    list(GET b 0 step)
    list(GET b 1 begin)
    foreach(tower IN LISTS towers)
      string(REPLACE ":" ";" t "${tower}")
      list(GET t 0 tower_step)
      list(GET t 1 tower_begin)
      list(GET t 2 tower_end)
      if(step EQUAL tower_step AND NOT begin LESS tower_begin AND begin LESS tower_end)
        set(${out_var} TRUE PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
  set(${out_var} FALSE PARENT_SCOPE)
endfunction()

# GPU towers, where a GPU is visible (tests/run_gpu.sh; CI has none): one short block with its own
# expectations, and nothing else (the host towers' checks below are CI's, on a machine without a GPU). fp32 towers with a timeline: no blas: line (cuBLAS), reduce::automatic names its choice,
# every step holds each GPU tower's compute and split copy and the device's reduction; fp16 towers with
# dynamic loss scaling. (train --compare-backends on GPU towers: tests/run_gpu.sh's train phase.)
# count_spans(TRACE ROW PREFIX OUT): the complete spans on row ROW whose name begins with PREFIX.
function(count_spans trace_file row_name prefix out_var)
  file(READ ${trace_file} trace)
  string(JSON count LENGTH "${trace}" traceEvents)
  math(EXPR last "${count} - 1")
  set(tid "")
  set(found 0)
  foreach(i RANGE ${last})  # the row's name (metadata) comes before its spans
    string(JSON kind GET "${trace}" traceEvents ${i} ph)
    string(JSON name GET "${trace}" traceEvents ${i} name)
    if(kind STREQUAL "M" AND name STREQUAL "thread_name")
      string(JSON row GET "${trace}" traceEvents ${i} args name)
      if(row STREQUAL row_name)
        string(JSON tid GET "${trace}" traceEvents ${i} tid)
      endif()
    endif()
  endforeach()
  foreach(i RANGE ${last})
    string(JSON kind GET "${trace}" traceEvents ${i} ph)
    string(JSON name GET "${trace}" traceEvents ${i} name)
    string(JSON event_tid GET "${trace}" traceEvents ${i} tid)
    string(FIND "${name}" "${prefix}" at)
    if(kind STREQUAL "X" AND NOT tid STREQUAL "" AND event_tid STREQUAL tid AND at EQUAL 0)
      math(EXPR found "${found} + 1")
    endif()
  endforeach()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()
run_train_on(gpu 0 ${small} --epochs 1 --towers 2 --timeline ${WORK}/gpu_trace.json)
if(gpu MATCHES "2 GPU towers")
  if(gpu MATCHES "\nblas: " OR NOT gpu MATCHES "\nbackend: reduce::[a-z0-9_]+, chosen by reduce::automatic: " OR
     NOT gpu MATCHES "parameters checksum [0-9a-f]+")
    message(FATAL_ERROR "GPU towers: no blas: line, reduce::automatic's choice and a checksum expected:\n${gpu}")
  endif()
  foreach(expect "tower 0 (GPU)|compute|15" "tower 1 (GPU)|compute|15" "tower 0 (GPU copy)|split copy|15" "split|check + split|15")
    string(REPLACE "|" ";" expect "${expect}")
    list(GET expect 0 row)
    list(GET expect 1 prefix)
    list(GET expect 2 expected)
    count_spans(${WORK}/gpu_trace.json "${row}" "${prefix}" spans)
    if(NOT spans EQUAL expected)
      message(FATAL_ERROR "GPU towers: ${spans} spans '${prefix}' on row '${row}', expected ${expected} (${WORK}/gpu_trace.json)")
    endif()
  endforeach()
  run_train_on(gpu 0 ${small} --epochs 1 --towers 2 --precision fp16)
  if(NOT gpu MATCHES "2 GPU towers" OR NOT gpu MATCHES "\nloss scaling: dynamic, from 65536 " OR
     NOT gpu MATCHES "\nloss scale: [0-9]+ at the end; [0-9]+ of 15 steps skipped")
    message(FATAL_ERROR "fp16 GPU towers must train with dynamic loss scaling and report it:\n${gpu}")
  endif()
  message(STATUS "train program: GPU towers checked; the host towers' checks are CI's (run without a GPU)")
  return()
elseif(NOT gpu MATCHES "2 host towers")
  message(FATAL_ERROR "the model line must name the towers:\n${gpu}")
endif()

# It trains: accuracy far above chance (10%) after 3 epochs, and rises from the first epoch. Flags
# take "--flag value" and "--flag=value".
run_train(out 0 ${small} --epochs=3 --towers 3 --lr=0.01)
final_field("${out}" "epoch 1/3: test accuracy ([0-9.]+)%" first)
final_field("${out}" "final: test accuracy ([0-9.]+)%" last)
if(last LESS 60 OR last LESS first)
  message(FATAL_ERROR "accuracy ${first}% -> ${last}%: not learning\n${out}")
endif()
if(NOT out MATCHES "\nprecision: fp32 towers\n")
  message(FATAL_ERROR "the header must name the towers' precision (fp32 by default):\n${out}")
endif()
final_field("${out}" "parameters checksum ([0-9a-f]+)" fp32_checksum)
# 16-bit towers: the same training with bf16 (no loss scaling) and fp16 towers (dynamic loss scaling,
# on by default) learns as well, and ends elsewhere than fp32 towers do (the towers really are 16-bit:
# their parameters rounded, their gradients narrowed).
foreach(precision bf16 fp16)
  run_train(out 0 ${small} --epochs=3 --towers 3 --lr=0.01 --precision ${precision})
  final_field("${out}" "final: test accuracy ([0-9.]+)%" accuracy)
  final_field("${out}" "parameters checksum ([0-9a-f]+)" checksum)
  if(accuracy LESS 60 OR checksum STREQUAL fp32_checksum OR
     NOT out MATCHES "\nprecision: ${precision} towers \\(16-bit parameters and gradients; fp32 master")
    message(FATAL_ERROR "--precision ${precision}: accuracy ${accuracy}%, checksum ${checksum} (fp32: ${fp32_checksum}):\n${out}")
  endif()
  if(precision STREQUAL "fp16")
    if(NOT out MATCHES "\nloss scaling: dynamic, from 65536 " OR NOT out MATCHES "\nloss scale: [0-9]+ at the end; [0-9]+ of 45 steps skipped")
      message(FATAL_ERROR "--precision fp16 must turn dynamic loss scaling on and report it:\n${out}")
    endif()
  elseif(out MATCHES "loss scal")
    message(FATAL_ERROR "--precision ${precision} needs no loss scaling:\n${out}")
  endif()
endforeach()
# The BLAS line names the library and the kernel it took; where OpenBLAS took a kernel with narrower
# vectors than the CPU has (forced here: Prescott, no AVX2; Haswell, AVX2 on a CPU with AVX-512),
# --openblas-core names one that fits, and the run says so. Expected cores from /proc/cpuinfo's flags.
final_field("${out}" "blas: ([^\n]*)" blas)
if(blas MATCHES "^OpenBLAS .*, kernel [A-Za-z0-9]+$")
  file(READ /proc/cpuinfo cpuinfo)
  set(has_avx2 FALSE)
  set(has_avx512 FALSE)
  if(cpuinfo MATCHES "[ \t]avx2[ \t\n]" AND cpuinfo MATCHES "[ \t]fma[ \t\n]")
    set(has_avx2 TRUE)
  endif()
  if(cpuinfo MATCHES "[ \t]avx512f[ \t\n]" AND cpuinfo MATCHES "[ \t]avx512bw[ \t\n]" AND
     cpuinfo MATCHES "[ \t]avx512dq[ \t\n]" AND cpuinfo MATCHES "[ \t]avx512vl[ \t\n]")
    set(has_avx512 TRUE)
  endif()
  set(avx512_core SkylakeX)
  if(cpuinfo MATCHES "[ \t]avx512_bf16[ \t\n]")
    set(avx512_core Cooperlake)
  endif()
  foreach(forced Prescott Haswell)
    set(expected "")
    if(has_avx512)
      set(expected ${avx512_core})
    elseif(has_avx2 AND forced STREQUAL "Prescott")
      set(expected Haswell)
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_CORETYPE=${forced} ${TRAIN} --openblas-core
                    OUTPUT_VARIABLE core OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT core STREQUAL expected)
      message(FATAL_ERROR "OpenBLAS forced to ${forced}: --openblas-core printed '${core}', expected '${expected}'")
    endif()
    set(${forced}_core "${core}")
  endforeach()
  if(has_avx2)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_CORETYPE=Prescott ${TRAIN} --cpu-towers ${small} --epochs 1
                    RESULT_VARIABLE status OUTPUT_VARIABLE forced)
    if(NOT status EQUAL 0 OR NOT forced MATCHES "blas: [^\n]*kernel Prescott\nblas: this kernel's vectors are narrower than this CPU's[^\n]*OPENBLAS_CORETYPE=${Prescott_core} ")
      message(FATAL_ERROR "OpenBLAS forced to Prescott: the run did not name OPENBLAS_CORETYPE=${Prescott_core}:\n${forced}")
    endif()
  endif()
elseif(NOT blas MATCHES "^none: a plain loop")
  message(FATAL_ERROR "blas line '${blas}'")
endif()
# The summary says where a step's time went.
final_field("${out}" "stages, mean per step: split [0-9.]+ ms, towers ([0-9.]+) ms" towers_ms)
final_field("${out}" "stages, mean per step: .* reduce ([0-9.]+) ms" reduce_ms)
if(NOT towers_ms GREATER 0 OR NOT reduce_ms GREATER 0)
  message(FATAL_ERROR "stage times not reported:\n${out}")
endif()
# Step time as a distribution without the warm-up, and progress lines with the step count and ETA.
if(NOT out MATCHES "step time: median [0-9.]+ ms, p95 [0-9.]+, p99 [0-9.]+, max [0-9.]+ \\([0-9]+ steps; the first 5 left out as warm-up\\)")
  message(FATAL_ERROR "no step-time distribution:\n${out}")
endif()
run_train(out 0 ${small} --epochs 1 --log-every 5 --metrics ${WORK}/metrics/run.csv)
if(NOT out MATCHES "step 10/15, loss = [0-9.]+ \\([0-9.]+ examples/sec; [0-9.]+ ms/batch; ETA [0-9]+ s\\)")
  message(FATAL_ERROR "no progress line with step N/total and ETA:\n${out}")
endif()
file(STRINGS ${WORK}/metrics/run.csv rows)
list(LENGTH rows row_count)
list(GET rows 0 header)
# A header, a row per 5 steps (3), a row for the epoch's accuracy.
if(NOT row_count EQUAL 5 OR NOT header STREQUAL "step,epoch,loss,examples_per_second,ms_per_step,test_accuracy")
  message(FATAL_ERROR "--metrics wrote ${row_count} rows:\n${rows}")
endif()
run_train(out 0 -h)
if(NOT out MATCHES "^train — ")
  message(FATAL_ERROR "-h must print the usage: ${out}")
endif()

# Every optimizer, layout and precision runs (16-bit towers: one layout per precision, the one it
# takes without --layout).
foreach(optimizer sgd momentum adam adamw)
  foreach(layout flat per_variable)
    run_train(out 0 --generated 200 --batch-size 20 --epochs 1 --optimizer ${optimizer} --layout ${layout})
  endforeach()
  foreach(precision_layout "bf16|flat" "fp16|per_variable")
    string(REPLACE "|" ";" precision_layout "${precision_layout}")
    list(GET precision_layout 0 precision)
    list(GET precision_layout 1 layout)
    run_train(out 0 --generated 200 --batch-size 20 --epochs 1 --optimizer ${optimizer} --precision ${precision})
    if(NOT out MATCHES ", layout::${layout}, ")
      message(FATAL_ERROR "--precision ${precision} must train layout::${layout} towers:\n${out}")
    endif()
    run_train(out 0 --generated 200 --batch-size 20 --epochs 1 --optimizer ${optimizer} --precision ${precision} --layout ${layout})
  endforeach()
endforeach()

# The tutorial's CNN trains on host towers (its gradients are checked against finite differences in
# tests/host/test_example_cnn.cpp): the loss falls from the first progress line to the last. Its dense
# layers' buckets are reduced while the convolutions' backward runs (tens of milliseconds), which the
# timeline shows: a span of row "reduce (during towers)" inside a tower's compute span.
run_train(out 0 --model cnn --cpu-towers --generated 640 --batch-size 64 --epochs 2 --log-every 2 --lr 0.0003
          --timeline ${WORK}/cnn_trace.json)
if(NOT out MATCHES "model: CNN conv5x5x64-pool-conv5x5x64-pool-fc384-fc192-fc10, 1384586 parameters")
  message(FATAL_ERROR "--model cnn must train the tutorial's network:\n${out}")
endif()
final_field("${out}" "step 2/20, loss = ([0-9.]+)" cnn_first)
final_field("${out}" "step 20/20, loss = ([0-9.]+)" cnn_last)
if(NOT cnn_last LESS cnn_first)
  message(FATAL_ERROR "the CNN's loss went from ${cnn_first} to ${cnn_last}: not learning\n${out}")
endif()
bucket_inside_towers(${WORK}/cnn_trace.json inside)
if(NOT inside OR NOT out MATCHES "overlap: 4.0 of 5 gradient buckets a step reduced during the towers")
  message(FATAL_ERROR "the CNN's gradient buckets were not reduced while its towers ran (${WORK}/cnn_trace.json):\n${out}")
endif()

# --compare-backends: the same training through every backend and layout the towers allow, one table,
# every run ending with the same parameter bits (host towers: reduce::host with both layouts, with and
# without the overlap, and reduce::sharded).
run_train(out 0 --cpu-towers --compare-backends --generated 200 --batch-size 20 --epochs 1 --towers 3)
set(figures "[0-9]+ \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+% \\| [0-9]+% \\| [0-9.]+% \\| [0-9a-f]+ \\|")
foreach(row "host \\| flat \\| on" "host \\| flat \\| off" "sharded \\| flat \\| on"
            "host \\| per_variable \\| on" "host \\| per_variable \\| off" "sharded \\| per_variable \\| on")
  if(NOT out MATCHES "\n\\| ${row} \\| ${figures}\n")
    message(FATAL_ERROR "--compare-backends must print a row '${row}':\n${out}")
  endif()
endforeach()
if(NOT out MATCHES "checksums: all equal")
  message(FATAL_ERROR "--compare-backends must end every run with the same checksum:\n${out}")
endif()
# With 16-bit towers too (in their precision's layout): every backend ends with bitwise the same fp32
# master (exit 1 if not), fp16 with its loss scaling.
foreach(precision_layout "bf16|flat" "fp16|per_variable")
  string(REPLACE "|" ";" precision_layout "${precision_layout}")
  list(GET precision_layout 0 precision)
  list(GET precision_layout 1 layout)
  run_train(out 0 --cpu-towers --compare-backends --precision ${precision} --generated 200 --batch-size 20 --epochs 1 --towers 3)
  foreach(row "host \\| ${layout} \\| on" "host \\| ${layout} \\| off" "sharded \\| ${layout} \\| on")
    if(NOT out MATCHES "\n\\| ${row} \\| ${figures}\n")
      message(FATAL_ERROR "--compare-backends --precision ${precision} must print a row '${row}':\n${out}")
    endif()
  endforeach()
  if(NOT out MATCHES "compare: 3 ${precision} host towers" OR NOT out MATCHES "checksums: all equal")
    message(FATAL_ERROR "--compare-backends --precision ${precision} must end every run with the same checksum:\n${out}")
  endif()
endforeach()

# --time-backends: reduce::automatic times its candidates on the first step, keeps the fastest, and the
# run ends bitwise where the untimed one does (every backend gives the same bits).
run_train(untimed 0 --cpu-towers ${small} --epochs 1 --towers 2)
run_train(timed 0 --cpu-towers ${small} --epochs 1 --towers 2 --time-backends 2)
final_field("${untimed}" "parameters checksum ([0-9a-f]+)" untimed_sum)
final_field("${timed}" "parameters checksum ([0-9a-f]+)" timed_sum)
if(NOT untimed_sum STREQUAL timed_sum)
  message(FATAL_ERROR "--time-backends changed the parameters: ${untimed_sum} against ${timed_sum}\n${timed}")
endif()
if(NOT timed MATCHES "backend: reduce::(host|sharded) kept: timed on this machine's first step \\(median of 2; bitwise equal\\): host [0-9.]+ ms, sharded [0-9.]+ ms")
  message(FATAL_ERROR "--time-backends must say which backend it kept and the timings:\n${timed}")
endif()

# Bad input: one line, non-zero.
foreach(case "--towers;x|--towers needs a positive whole number"
             "--model;rnn|--model 'rnn' is not one of mlp"
             "--compare-backends;--backend;host|--compare-backends runs several trainings: it takes no --backend"
             "--towers;0|--towers needs a positive whole number"
             "--optimizer;rmsprop|--optimizer 'rmsprop' is not one of"
             "--layout;dense|--layout 'dense' is not one of"
             "--precision;fp64|--precision 'fp64' is not one of fp32 . bf16 . fp16$"
             "--precision;bf16;--layout;per_variable|--precision bf16 trains layout::flat towers only .*: use --layout flat, or --precision fp16 or fp32 for layout::per_variable$"
             "--precision;fp16;--layout;flat|--precision fp16 trains layout::per_variable towers only .*: use --layout per_variable, or --precision bf16 or fp32 for layout::flat$"
             "--backend;device0;--cpu-towers|needs GPU towers"  # invalid with or without a GPU
             "--transport;tcp|--transport 'tcp' is not one of mpi"
             "--transport;nccl|--transport chooses how --ranks exchange: it needs --ranks"
             "--ranks;--transport;nccl;--cpu-towers|--transport nccl"  # no NCCL in the build, or no GPU towers
             "--time-backends;2;--backend;host|--time-backends times reduce::automatic's candidates: it needs --backend auto, not host"
             "--time-backends;0|--time-backends needs a positive whole number"
             "--time-backends;101|--time-backends 101: at most 100 \\(each trial"
             "--time-backends;18446744073709551615|--time-backends 18446744073709551615: at most 100"
             "--lr;-1|--lr needs a positive number"
             "--frobnicate;1|unknown argument --frobnicate"
             "--towers=x|--towers needs a positive whole number"
             "--resume=yes|--resume takes no value"
             "--generated;10|--batch-size 128 \\(the default\\) is larger than the training set \\(10 examples\\)"
             "--resume|--resume needs --checkpoint"
             "--epochs|--epochs needs a value"
             "--towers;+5|--towers needs a positive whole number, not '\\+5'"
             "--towers; 5|--towers needs a positive whole number, not ' 5'"
             "--seed;-1|--seed needs a whole number"
             "--epochs;99999999999999999999999|--epochs 99999999999999999999999 is too large"
             "--generated;18446744073709551615|--generated 18446744073709551615: at most 10000000 examples"
             "--metrics=|--metrics needs a path, not an empty string"
             "--checkpoint=|--checkpoint needs a path"
             "--generated;600;--towers;1000|--batch-size 128 \\(the default\\) is smaller than the 1000 towers")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts -1 expected)
  list(REMOVE_AT parts -1)
  run_train(out 2 ${parts})
  string(STRIP "${out}" out)
  if(NOT out MATCHES "^train: .*${expected}" OR out MATCHES "\n")
    message(FATAL_ERROR "train ${parts}: expected one line with '${expected}', got:\n${out}")
  endif()
endforeach()
# --seed 0 is a seed like any other.
run_train(out 0 ${small} --epochs 1 --seed 0)
# A full disk: the metrics cannot be written, and the program says so and fails.
if(EXISTS /dev/full)
  run_train(out 1 ${small} --epochs 1 --metrics /dev/full)
  if(NOT out MATCHES "train: --metrics /dev/full: writing failed")
    message(FATAL_ERROR "a --metrics that cannot be written must fail: ${out}")
  endif()
  run_train(out 1 ${small} --epochs 1 --timeline /dev/full)
  if(NOT out MATCHES "train: .*timeline: cannot write /dev/full")
    message(FATAL_ERROR "a --timeline that cannot be written must fail: ${out}")
  endif()
endif()
run_train(out 1 --data ${WORK}/nowhere --epochs 1)
if(NOT out MATCHES "^train: cannot open")
  message(FATAL_ERROR "a missing data set must say so: ${out}")
endif()
# Output paths are checked before training: nothing trains when one cannot be written.
file(WRITE ${WORK}/a_file "")
run_train(out 1 ${small} --epochs 1 --timeline ${WORK}/a_file/trace.json)
if(NOT out MATCHES "^train: --timeline .*a_file/trace.json: cannot write there" OR out MATCHES "epoch")
  message(FATAL_ERROR "an unwritable --timeline must fail before training: ${out}")
endif()
run_train(out 1 ${small} --epochs 1 --checkpoint ${WORK}/a_file/nested)
if(NOT out MATCHES "^train: --checkpoint .*: cannot create or write the directory" OR out MATCHES "epoch")
  message(FATAL_ERROR "an unwritable --checkpoint must fail before training: ${out}")
endif()

# The timeline: a complete span per stage and tower, every step, and one per gradient bucket reduced
# while the towers ran (the MLP's three layers: every bucket is marked before the towers return).
# --no-overlap reduces them after the towers — no such spans — and ends with the same bits.
run_train(overlapped 0 ${small} --epochs 1 --towers 2 --timeline ${WORK}/trace.json)
run_train(serial 0 ${small} --epochs 1 --towers 2 --timeline ${WORK}/serial_trace.json --no-overlap)
foreach(run "trace|115" "serial_trace|68")
  string(REPLACE "|" ";" run "${run}")
  list(GET run 0 name)
  list(GET run 1 expected)
  file(READ ${WORK}/${name}.json trace)
  string(JSON events LENGTH "${trace}" traceEvents)
  # 600 / 40 = 15 steps x (split + 2 towers + reduce [+ 3 buckets]), plus a name and a sort index for
  # each of 4 [5] rows.
  if(NOT events EQUAL expected)
    message(FATAL_ERROR "${name}.json has ${events} events, expected ${expected}")
  endif()
endforeach()
final_field("${overlapped}" "parameters checksum ([0-9a-f]+)" a)
final_field("${serial}" "parameters checksum ([0-9a-f]+)" b)
if(NOT a STREQUAL b OR NOT overlapped MATCHES "overlap: 2.0 of 3 gradient buckets a step reduced during the towers" OR
   NOT serial MATCHES "overlap: off \\(--no-overlap\\)")
  message(FATAL_ERROR "--no-overlap ends at ${b}, the overlapped run at ${a}:\n${overlapped}\n${serial}")
endif()

# Resume: 2 epochs straight equal 1 epoch, a checkpoint, then 1 more epoch resumed — bitwise. The
# checkpoint directory is created however deep; --resume with nothing there says so and starts at 0.
run_train(straight 0 ${small} --epochs 2 --checkpoint ${WORK}/straight)
run_train(first 0 ${small} --epochs 1 --checkpoint ${WORK}/deep/er/resumed --resume)
if(NOT first MATCHES "nothing to resume: .*towerpipe.ckpt does not exist; starting at step 0" OR
   NOT first MATCHES "checkpoint: .*/deep/er/resumed/towerpipe.ckpt \\(step 15\\)")
  message(FATAL_ERROR "a fresh --resume must say there is nothing to resume, and save:\n${first}")
endif()
file(RENAME ${WORK}/deep/er/resumed ${WORK}/resumed)
run_train(second 0 ${small} --epochs 2 --checkpoint ${WORK}/resumed --resume)
final_field("${straight}" "parameters checksum ([0-9a-f]+)" a)
final_field("${second}" "parameters checksum ([0-9a-f]+)" b)
if(NOT a STREQUAL b OR NOT second MATCHES "resumed from")
  message(FATAL_ERROR "resumed run ends at ${b}, the uninterrupted one at ${a}\n${second}")
endif()
# The same with bf16 towers: the checkpoint holds the fp32 master, and the resumed run ends bitwise
# where the uninterrupted one does.
run_train(straight 0 ${small} --epochs 2 --precision bf16 --checkpoint ${WORK}/bf16_straight)
run_train(first 0 ${small} --epochs 1 --precision bf16 --checkpoint ${WORK}/bf16_resumed)
run_train(second 0 ${small} --epochs 2 --precision bf16 --checkpoint ${WORK}/bf16_resumed --resume)
final_field("${straight}" "parameters checksum ([0-9a-f]+)" a)
final_field("${second}" "parameters checksum ([0-9a-f]+)" b)
if(NOT a STREQUAL b OR NOT second MATCHES "resumed from")
  message(FATAL_ERROR "--precision bf16: resumed run ends at ${b}, the uninterrupted one at ${a}\n${second}")
endif()
# fp16 towers skip the steps that overflow (dynamic loss scaling), so the step count is short of the
# batches consumed: the resumed run finds its epoch in the checkpoint's data cursor (save_checkpoint's
# user data) and ends bitwise where the uninterrupted one does.
# (3 towers at lr 0.01 overflow in 5 of the first epoch's 15 steps.)
set(fp16_run ${small} --precision fp16 --towers 3 --lr 0.01)
run_train(straight 0 ${fp16_run} --epochs 2 --checkpoint ${WORK}/fp16_straight)
run_train(first 0 ${fp16_run} --epochs 1 --checkpoint ${WORK}/fp16_resumed)
run_train(second 0 ${fp16_run} --epochs 2 --checkpoint ${WORK}/fp16_resumed --resume)
final_field("${first}" "checkpoint: [^\n]*\\(step ([0-9]+)\\)" fp16_steps)
if(NOT fp16_steps LESS 15)  # 15 batches an epoch: some step must have been skipped for this to test anything
  message(FATAL_ERROR "--precision fp16: no step skipped in the first epoch (${fp16_steps} steps)\n${first}")
endif()
final_field("${straight}" "parameters checksum ([0-9a-f]+)" a)
final_field("${second}" "parameters checksum ([0-9a-f]+)" b)
if(NOT a STREQUAL b OR NOT second MATCHES "resumed from [^\n]* at step ${fp16_steps} \\(epoch 1\\)")
  message(FATAL_ERROR "--precision fp16: resumed run ends at ${b}, the uninterrupted one at ${a}\n${first}\n${second}")
endif()
file(WRITE ${WORK}/resumed/towerpipe.ckpt "damaged")
run_train(out 1 ${small} --epochs 2 --checkpoint ${WORK}/resumed --resume)
if(NOT out MATCHES "not a towerpipe checkpoint")
  message(FATAL_ERROR "a damaged checkpoint must be rejected: ${out}")
endif()

message(STATUS "train program: all checks passed")
