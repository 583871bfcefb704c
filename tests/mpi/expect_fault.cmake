# Runs COMMAND (an mpirun line of sharded_equivalence's mode "fault", whose stopped ranks never return
# from their towers) and checks that every rank in SURVIVORS reported the deadline within 1.5 deadlines
# naming exactly the stopped ranks (the program checks both and prints "all checks passed"), and that
# the job ended (the survivors abort it at twice the deadline) rather than hung.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors TIMEOUT 60)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message(STATUS "exit ${status} after ${seconds} s:\n${output}\n${errors}")
if(status EQUAL 0 OR seconds GREATER 40)
  message(FATAL_ERROR "expected the survivors to end the job within 40 s")
endif()
if(output MATCHES "FAILED")
  message(FATAL_ERROR "a survivor's check failed (above)")
endif()
string(REPLACE "," ";" survivors "${SURVIVORS}")  # given as 0,1,2
foreach(rank IN LISTS survivors)
  if(NOT output MATCHES "rank ${rank}: fault: reported after [0-9.]+ s \\(deadline 3 s\\): towerpipe: [^\n]*nothing came from rank\\(s\\) ${STOPPED}[;)\n]")
    message(FATAL_ERROR "rank ${rank} did not report the deadline naming rank(s) ${STOPPED}")
  endif()
  if(NOT output MATCHES "rank ${rank}: fault: all checks passed")
    message(FATAL_ERROR "rank ${rank} did not pass its checks")
  endif()
endforeach()
