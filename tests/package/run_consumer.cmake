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

# Outside CMake: the installed pkg-config file gives what a plain g++ command line needs.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs towerpipe OUTPUT_VARIABLE flags RESULT_VARIABLE result
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "package test: pkg-config does not find the installed towerpipe.pc (${result})")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run_step(g++ -std=c++17 -O2 ${CONSUMER_SOURCE_DIR}/consumer.cpp ${flags} -o ${WORK_DIR}/consumer_pkg_config)
run_step(${WORK_DIR}/consumer_pkg_config)
