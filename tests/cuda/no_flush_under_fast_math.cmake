# ctest cuda.no_flush_under_fast_math: compiles tests/cuda/fast_math_probe.cu (the library's device
# element programs) with -use_fast_math to PTX and fails on any float add, sub, mul, div or sqrt that
# flushes subnormals (.ftz) or is approximate, and on any fused multiply-add: each would break the
# bitwise equality with the host (core/rounded_math.hpp). Comparisons are left to the compiler: under
# -ftz a subnormal compares equal to zero, which changes a result only through a subnormal
# hyper-parameter (weight decay, momentum). -D NVCC, INCLUDE, SOURCE, OUT.
execute_process(COMMAND ${NVCC} -std=c++17 -arch=sm_90 -use_fast_math -ptx -I${INCLUDE} ${SOURCE} -o ${OUT}
                RESULT_VARIABLE status ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "nvcc failed on ${SOURCE}: ${errors}")
endif()
file(STRINGS ${OUT} arithmetic REGEX "^[ \t]*(add|sub|mul|div|sqrt|fma|rcp)\\.[a-z0-9.]*f32")
list(LENGTH arithmetic count)
if(count LESS 100)
  message(FATAL_ERROR "only ${count} float arithmetic instructions in ${OUT}: the probe no longer instantiates the kernels")
endif()
foreach(line IN LISTS arithmetic)
  if(line MATCHES "\\.ftz|\\.approx|^[ \t]*(fma|rcp)\\.")
    message(FATAL_ERROR "${OUT}: '${line}' under -use_fast_math: the device's float arithmetic must round each operation and keep subnormals")
  endif()
endforeach()
message(STATUS "${count} float arithmetic instructions, none flushing, approximate or fused")
