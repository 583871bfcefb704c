# The training program across processes (train --ranks under mpirun, reduce::sharded), on GENERATED
# data: 2 processes x 2 towers and 4 processes x 1 tower end bitwise where one process with 4 towers ends
# (reduce::host), with the same test accuracy; only rank 0 prints. The towers are GPU towers where a GPU
# is visible (every run alike: the towers' own arithmetic differs between host and GPU), host towers
# elsewhere.
# 16-bit host towers (bf16, fp16) likewise 2 x 2 against one process.
# Run as: cmake -DTRAIN=<path> -DMPIRUN=<mpirun;flags...> -P train_ranks.cmake
set(common --generated 600 --batch-size 45 --epochs 2 --log-every 1000 --optimizer adam --lr 0.01)

function(run out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors TIMEOUT 120)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${ARGN}: exit ${status}\n${output}\n${errors}")
  endif()
  set(${out_var} "${output}" PARENT_SCOPE)
endfunction()

function(checksum output out_var)
  string(REGEX MATCHALL "parameters checksum [0-9a-f]+" found "${output}")
  list(LENGTH found count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "expected one summary line (rank 0 alone prints), found ${count}:\n${output}")
  endif()
  string(REGEX REPLACE ".* " "" value "${found}")
  set(${out_var} ${value} PARENT_SCOPE)
endfunction()

run(one ${TRAIN} ${common} --towers 4 --backend host)
checksum("${one}" reference)
run(two ${MPIRUN} -np 2 ${TRAIN} ${common} --ranks --towers 2)
checksum("${two}" two_by_two)
run(four ${MPIRUN} -np 4 ${TRAIN} ${common} --ranks --towers 1)
checksum("${four}" four_by_one)
if(NOT two_by_two STREQUAL reference OR NOT four_by_one STREQUAL reference)
  message(FATAL_ERROR "one process: ${reference}; 2 x 2: ${two_by_two}; 4 x 1: ${four_by_one}\n${two}\n${four}")
endif()
if(NOT two MATCHES "2 (host|GPU) towers in each of 2 processes, reduce::sharded")
  message(FATAL_ERROR "the model line must say how the towers spread:\n${two}")
endif()
# 16-bit host towers too (fp16 with its dynamic loss scaling): 2 x 2 ends where one process with 4
# towers ends.
foreach(precision bf16 fp16)
  run(one ${TRAIN} ${common} --towers 4 --backend host --cpu-towers --precision ${precision})
  checksum("${one}" one_process)
  run(two ${MPIRUN} -np 2 ${TRAIN} ${common} --ranks --towers 2 --cpu-towers --precision ${precision})
  checksum("${two}" two_by_two)
  if(NOT two_by_two STREQUAL one_process OR NOT two MATCHES "\nprecision: ${precision} towers")
    message(FATAL_ERROR "--precision ${precision}: one process: ${one_process}; 2 x 2: ${two_by_two}\n${two}")
  endif()
endforeach()
message(STATUS "train --ranks: 2 x 2 and 4 x 1 processes x towers equal one process with 4 towers (${reference})")
