# Builds exactness/contracted_consumer.cpp twice with the compiler COMPILER — once with contraction off, once
# as many users build (-O3 -march=native, GNU dialect, -ffp-contract=fast) — and requires the library's
# parameters to be bitwise equal in both, while the plain C++ version of the same formulas differs (so the
# second build really fused multiply-adds). Where -march=native has no FMA no build can contract and the
# check would prove nothing: it then prints "check skipped", which ctest reports as skipped
# (SKIP_REGULAR_EXPRESSION).
set(exact_flags -O2 -std=c++17 -ffp-contract=off)
set(contracted_flags -O3 -march=native -std=gnu++17 -ffp-contract=fast)
foreach(build exact contracted)
  set(binary ${WORK_DIR}/consumer_${build})
  execute_process(COMMAND ${COMPILER} ${${build}_flags} -I${INCLUDE_DIR} ${SOURCE} -o ${binary} -pthread
                  RESULT_VARIABLE result ERROR_VARIABLE diagnostics)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "exactness: the ${build} build failed:\n${diagnostics}")
  endif()
  execute_process(COMMAND ${binary} RESULT_VARIABLE result OUTPUT_VARIABLE ${build}_output OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "exactness: the ${build} consumer failed (${result})")
  endif()
  message(STATUS "${build} (${${build}_flags}): ${${build}_output}")
  string(REGEX MATCH "fma ([01]) library ([0-9a-f]+) plain ([0-9a-f]+)" _ "${${build}_output}")
  set(${build}_fma ${CMAKE_MATCH_1})
  set(${build}_library ${CMAKE_MATCH_2})
  set(${build}_plain ${CMAKE_MATCH_3})
endforeach()
if(NOT contracted_fma)
  message(STATUS "exactness: -march=native has no FMA on this machine; nothing can contract: check skipped")
  return()
endif()
if(contracted_plain STREQUAL exact_plain)
  message(FATAL_ERROR "exactness: the contracted build did not change plain C++ results; the check proves nothing")
endif()
if(NOT contracted_library STREQUAL exact_library)
  message(FATAL_ERROR "exactness: the library's parameters depend on the user's flags: ${exact_library} vs ${contracted_library}")
endif()
message(STATUS "exactness: library parameters bitwise equal under contraction; plain C++ differs (${exact_plain} vs ${contracted_plain})")
