# ctest fuzz.checkpoint_reader: builds tests/fuzz/checkpoint_fuzz.cpp with clang's libFuzzer, ASan and
# UBSan and fuzzes the checkpoint reader for SECONDS, starting from a copy of the seed corpus (the copy
# grows, the committed seeds stay). Prints "check skipped" (ctest: skipped) where clang cannot link
# libFuzzer; tests/run.sh installs it for CI.
find_program(CLANGXX NAMES clang++ clang++-14)
if(CLANGXX)
  execute_process(COMMAND ${CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a OUTPUT_VARIABLE fuzzer_library
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(NOT CLANGXX OR NOT EXISTS "${fuzzer_library}")
  message("check skipped: no clang++ with libFuzzer here (${CLANGXX}; libclang-rt-14-dev has the library)")
  return()
endif()
file(MAKE_DIRECTORY ${WORK_DIR})
set(harness ${WORK_DIR}/checkpoint_fuzz)
execute_process(COMMAND ${CLANGXX} -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
                  -I${INCLUDE_DIR} ${SOURCE_DIR}/checkpoint_fuzz.cpp -o ${harness}
                RESULT_VARIABLE built ERROR_VARIABLE diagnostics)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "the checkpoint fuzz harness does not build:\n${diagnostics}")
endif()
file(REMOVE_RECURSE ${WORK_DIR}/corpus)
file(COPY ${SOURCE_DIR}/corpus/ DESTINATION ${WORK_DIR}/corpus)
execute_process(COMMAND ${harness} -max_total_time=${SECONDS} -print_final_stats=1 ${WORK_DIR}/corpus
                RESULT_VARIABLE result ERROR_VARIABLE log)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${log}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "the checkpoint fuzzer failed (${result}):\n${log}")
endif()
message("checkpoint reader fuzzed for ${SECONDS} s without a finding (${runs})")
