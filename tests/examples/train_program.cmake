# The training program end to end, on GENERATED data (CI has no Fashion-MNIST): it trains, every
# optimizer x layout runs, bad flags and files give a one-line error and a non-zero exit, the
# timeline holds every stage of every step, and resuming from a checkpoint ends bitwise where the
# uninterrupted run ends. Run as: cmake -DTRAIN=<path> -DWORK=<dir> -P train_program.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(small --generated 600 --batch-size 40 --log-every 1000)

function(run_train out_var expected_status)
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

# It trains: accuracy far above chance (10%) after 3 epochs, and rises from the first epoch. Flags
# take "--flag value" and "--flag=value".
run_train(out 0 ${small} --epochs=3 --towers 3 --lr=0.01)
final_field("${out}" "epoch 1/3: test accuracy ([0-9.]+)%" first)
final_field("${out}" "final: test accuracy ([0-9.]+)%" last)
if(last LESS 60 OR last LESS first)
  message(FATAL_ERROR "accuracy ${first}% -> ${last}%: not learning\n${out}")
endif()
# The BLAS line names the library and the kernel it took; where OpenBLAS took a kernel without AVX2
# (forced here: Prescott) on a CPU with AVX2, --openblas-core names one with it, and the run says so.
final_field("${out}" "blas: ([^\n]*)" blas)
if(blas MATCHES "^OpenBLAS .*, kernel [A-Za-z0-9]+$")
  file(READ /proc/cpuinfo cpuinfo)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_CORETYPE=Prescott ${TRAIN} --openblas-core
                  OUTPUT_VARIABLE core OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(cpuinfo MATCHES "[ \t]avx2[ \t\n]" AND cpuinfo MATCHES "[ \t]fma[ \t\n]")
    if(NOT core MATCHES "^(Haswell|SkylakeX|Cooperlake)$")
      message(FATAL_ERROR "OpenBLAS forced to Prescott on a CPU with AVX2: --openblas-core printed '${core}'")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_CORETYPE=Prescott ${TRAIN} ${small} --epochs 1
                    RESULT_VARIABLE status OUTPUT_VARIABLE forced)
    if(NOT status EQUAL 0 OR NOT forced MATCHES "blas: [^\n]*kernel Prescott\nblas: this kernel lacks AVX2[^\n]*OPENBLAS_CORETYPE=${core} ")
      message(FATAL_ERROR "OpenBLAS forced to Prescott: the run did not name OPENBLAS_CORETYPE=${core}:\n${forced}")
    endif()
  elseif(NOT core STREQUAL "")
    message(FATAL_ERROR "a CPU without AVX2: --openblas-core printed '${core}'")
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

# Every optimizer and layout runs.
foreach(optimizer sgd momentum adam adamw)
  foreach(layout flat per_variable)
    run_train(out 0 --generated 200 --batch-size 20 --epochs 1 --optimizer ${optimizer} --layout ${layout})
  endforeach()
endforeach()

# The tutorial's CNN trains on host towers (its gradients are checked against finite differences in
# tests/host/test_example_cnn.cpp): the loss falls from the first progress line to the last.
run_train(out 0 --model cnn --cpu-towers --generated 640 --batch-size 64 --epochs 2 --log-every 2 --lr 0.0003)
if(NOT out MATCHES "model: CNN conv5x5x64-pool-conv5x5x64-pool-fc384-fc192-fc10, 1384586 parameters")
  message(FATAL_ERROR "--model cnn must train the tutorial's network:\n${out}")
endif()
final_field("${out}" "step 2/20, loss = ([0-9.]+)" cnn_first)
final_field("${out}" "step 20/20, loss = ([0-9.]+)" cnn_last)
if(NOT cnn_last LESS cnn_first)
  message(FATAL_ERROR "the CNN's loss went from ${cnn_first} to ${cnn_last}: not learning\n${out}")
endif()

# --compare-backends: the same training through every backend and layout the towers allow, one table,
# every run ending with the same parameter bits (host towers: reduce::host with both layouts).
run_train(out 0 --cpu-towers --compare-backends --generated 200 --batch-size 20 --epochs 1 --towers 3)
if(NOT out MATCHES "\\| host \\| flat \\| [0-9]+ \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+% \\| [0-9.]+% \\| [0-9a-f]+ \\|" OR
   NOT out MATCHES "\\| host \\| per_variable \\|" OR NOT out MATCHES "checksums: all equal")
  message(FATAL_ERROR "--compare-backends must print a row per backend and layout, with equal checksums:\n${out}")
endif()

# Bad input: one line, non-zero.
foreach(case "--towers;x|--towers needs a positive whole number"
             "--model;rnn|--model 'rnn' is not one of mlp"
             "--compare-backends;--backend;host|--compare-backends runs several trainings: it takes no --backend"
             "--towers;0|--towers needs a positive whole number"
             "--optimizer;rmsprop|--optimizer 'rmsprop' is not one of"
             "--layout;dense|--layout 'dense' is not one of"
             "--backend;device0;--cpu-towers|needs GPU towers"  # invalid with or without a GPU
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

# The timeline: a complete span per stage and tower, every step.
run_train(out 0 ${small} --epochs 1 --towers 2 --timeline ${WORK}/trace.json)
file(READ ${WORK}/trace.json trace)
string(JSON events LENGTH "${trace}" traceEvents)
# 600 / 40 = 15 steps x (split + 2 towers + reduce), plus a name and a sort index for each of 4 rows.
if(NOT events EQUAL 68)
  message(FATAL_ERROR "timeline has ${events} events, expected 68")
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
file(WRITE ${WORK}/resumed/towerpipe.ckpt "damaged")
run_train(out 1 ${small} --epochs 2 --checkpoint ${WORK}/resumed --resume)
if(NOT out MATCHES "not a towerpipe checkpoint")
  message(FATAL_ERROR "a damaged checkpoint must be rejected: ${out}")
endif()
message(STATUS "train program: all checks passed")
