# Compiles SOURCE, which must FAIL to compile with the message given on its first line
# ("// expect: <text>"): invalid policy combinations are stopped by a static_assert that says why.
file(STRINGS ${SOURCE} first_line LIMIT_COUNT 1)
string(REGEX REPLACE "^// expect: " "" expected "${first_line}")
execute_process(COMMAND ${COMPILER} -std=c++17 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE}
                RESULT_VARIABLE result ERROR_VARIABLE diagnostics OUTPUT_QUIET)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but must not")
endif()
string(FIND "${diagnostics}" "${expected}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${SOURCE} failed to compile without saying '${expected}':\n${diagnostics}")
endif()
