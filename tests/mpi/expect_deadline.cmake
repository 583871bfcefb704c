# Runs COMMAND (an mpirun line whose last process never joins) and checks that the job ends with an
# error, not a hang: a non-zero exit within 30 s, and the other processes' deadline message.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors TIMEOUT 45)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message(STATUS "exit ${status} after ${seconds} s:\n${output}\n${errors}")
if(status EQUAL 0 OR seconds GREATER 30)
  message(FATAL_ERROR "expected a failure within 30 s")
endif()
if(NOT output MATCHES "rank 0: error: towerpipe: rank 0 of 3: [a-z ]+ did not complete within 3 s: another process has exited")
  message(FATAL_ERROR "rank 0 did not report the deadline")
endif()
# The rank that never joined is named (the last one, rank 2).
if(NOT output MATCHES "rank 0: error: [^\n]*; nothing came from rank\\(s\\) 2")
  message(FATAL_ERROR "rank 0 did not name the missing rank")
endif()
