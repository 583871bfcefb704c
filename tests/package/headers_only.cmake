# ctest package.headers_only_install: what a user who only wants the headers runs — configure the sources
# with tests, examples and benchmarks off, install — must probe for nothing but a C++ compiler and
# threads (no nvcc, CUDA toolkit, MPI, zlib, OpenBLAS, Catch2 or Python: each took time, 39 s of a 40 s
# install with CUDA's probe), and the installed package must serve a CMake project (host code, and the
# cuda component where the CUDA toolkit is) and a plain g++ command line through pkg-config.
# Run as: cmake -DSOURCE_DIR=<towerpipe> -DCONSUMER_SOURCE_DIR=<tests/package> -DWORK_DIR=<dir> -DGENERATOR=<g> -P headers_only.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(build ${WORK_DIR}/build)
set(prefix ${WORK_DIR}/prefix)

function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE errors)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "headers-only install: '${ARGV}' failed (${result}):\n${output}\n${errors}")
  endif()
  set(step_output "${output}${errors}" PARENT_SCOPE)
endfunction()

string(TIMESTAMP start "%s")
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} -G ${GENERATOR} -DTOWERPIPE_BUILD_TESTS=OFF
         -DTOWERPIPE_BUILD_EXAMPLES=OFF -DTOWERPIPE_BUILD_BENCHMARKS=OFF)
set(configure_output "${step_output}")
run_step(${CMAKE_COMMAND} --install ${build} --prefix ${prefix})
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message(STATUS "headers-only configure + install: about ${seconds} s\n${configure_output}")
foreach(probe CUDA nvcc MPI ZLIB zlib OpenBLAS openblas Catch2 Python cuDNN NCCL)
  if(configure_output MATCHES "${probe}")
    message(FATAL_ERROR "a headers-only configure looked for ${probe}:\n${configure_output}")
  endif()
endforeach()
foreach(file include/towerpipe/towerpipe.hpp include/towerpipe/cuda.cuh share/cmake/towerpipe/towerpipe-config.cmake
             share/cmake/towerpipe/towerpipe-cuda-targets.cmake share/pkgconfig/towerpipe.pc)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "the headers-only install lacks ${file}")
  endif()
endforeach()

# A user's CMake project against it (its CMakeLists.txt checks the cuda component where CUDA is found).
run_step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/consumer -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_CXX_COMPILER=g++)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run_step(${WORK_DIR}/consumer/consumer)

# And outside CMake.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
run_step(${PKG_CONFIG} --cflags --libs towerpipe)
string(STRIP "${step_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run_step(g++ -std=c++17 -O1 ${CONSUMER_SOURCE_DIR}/consumer.cpp ${flags} -o ${WORK_DIR}/consumer_pkg_config)
run_step(${WORK_DIR}/consumer_pkg_config)
