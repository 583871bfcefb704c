# Installs the towerpipe build tree into a fresh prefix, then configures, builds and runs the consumer
# project in this folder against that prefix — what a user's find_package(towerpipe) sees — and checks
# the optional benchmarks component.
set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test: '${ARGV}' failed (${result})")
  endif()
endfunction()

run_step(${CMAKE_COMMAND} --install ${TOWERPIPE_BUILD_DIR} --prefix ${prefix})
run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=g++)
run_step(${CMAKE_COMMAND} --build ${consumer_build})
run_step(${consumer_build}/consumer)

# The optional benchmarks component: the installed executable finds its installed variable lists.
run_step(${CMAKE_COMMAND} --install ${TOWERPIPE_BUILD_DIR} --prefix ${prefix} --component benchmarks)
execute_process(COMMAND ${prefix}/bin/towerpipe_host_benchmark --help OUTPUT_VARIABLE help RESULT_VARIABLE result)
if(NOT result EQUAL 0 OR NOT help MATCHES "read from ${prefix}/share/towerpipe/shapes")
  message(FATAL_ERROR "package test: the installed benchmark does not read its installed shapes (${result}):\n${help}")
endif()
if(NOT EXISTS ${prefix}/share/towerpipe/shapes/resnet50.shapes)
  message(FATAL_ERROR "package test: resnet50.shapes was not installed with the benchmarks component")
endif()
