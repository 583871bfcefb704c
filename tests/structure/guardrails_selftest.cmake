# The guardrails (guardrails.cmake) catch what they are for: on a copy of the library, a back-include
# (reduce/common/ including reduce/choice/, which includes it) and a header of 401 lines must each fail
# them, naming the folders and the header; the copy as it is must pass.
# Run as: cmake -DINCLUDE_DIR=<repo>/include -DWORK_DIR=<scratch> -DSCRIPT=<guardrails.cmake> -P guardrails_selftest.cmake
cmake_minimum_required(VERSION 3.25)

function(run_guardrails include_dir expect_failure expect_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${include_dir} -P ${SCRIPT} RESULT_VARIABLE result OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(expect_failure AND result EQUAL 0)
    message(FATAL_ERROR "the guardrails passed a library that breaks them (${expect_text}):\n${out}")
  endif()
  if(NOT expect_failure AND NOT result EQUAL 0)
    message(FATAL_ERROR "the guardrails failed the library as it is:\n${out}")
  endif()
  string(FIND "${out}" "${expect_text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the guardrails' output does not say '${expect_text}':\n${out}")
  endif()
endfunction()

foreach(case clean back_include long_header)
  set(copy ${WORK_DIR}/${case})
  file(REMOVE_RECURSE ${copy})
  file(COPY ${INCLUDE_DIR}/towerpipe DESTINATION ${copy})
endforeach()

run_guardrails(${WORK_DIR}/clean FALSE "none two-way")

file(APPEND ${WORK_DIR}/back_include/towerpipe/reduce/common/contract.hpp "#include \"towerpipe/reduce/choice/backends.hpp\"\n")
run_guardrails(${WORK_DIR}/back_include TRUE "folders reduce/choice and reduce/common include each other (depth 2)")

set(padding "")
foreach(line RANGE 1 401)
  string(APPEND padding "// line ${line}\n")
endforeach()
file(WRITE ${WORK_DIR}/long_header/towerpipe/core/long.hpp "${padding}")
run_guardrails(${WORK_DIR}/long_header TRUE "core/long.hpp has 401 lines (at most 400)")
message(STATUS "the guardrails pass the library, and fail a back-include and a 401-line header")
