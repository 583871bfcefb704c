# ctest examples.readme_snippets_catch_what_they_guard: readme_snippets.cmake run on doctored copies of the
# documents must fail, naming what is wrong — a quoted path that does not exist (in docs/), an altered
# snippet (in README.md), a broken link (in benchmarks/README.md), a README without the minimal program,
# a README past 1,500 words — and pass on an untouched copy.
# Run as: cmake -DSOURCE_DIR=<towerpipe> -DWORK_DIR=<dir> -P readme_snippets_self_test.cmake
set(checker ${CMAKE_CURRENT_LIST_DIR}/readme_snippets.cmake)

function(copy_documents)
  file(REMOVE_RECURSE ${WORK_DIR})
  file(MAKE_DIRECTORY ${WORK_DIR}/docs ${WORK_DIR}/benchmarks)
  file(COPY ${SOURCE_DIR}/README.md DESTINATION ${WORK_DIR})
  file(GLOB docs ${SOURCE_DIR}/docs/*.md)
  file(COPY ${docs} DESTINATION ${WORK_DIR}/docs)
  file(COPY ${SOURCE_DIR}/benchmarks/README.md DESTINATION ${WORK_DIR}/benchmarks)
endfunction()

# Runs the checker on the copy; `expected`: empty for a pass, else a regex its failure must match.
function(check case expected)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${SOURCE_DIR} -DDOCS_DIR=${WORK_DIR} -P ${checker}
                  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE errors)
  string(REPLACE "\n" " " said "${output}${errors}")
  string(REGEX REPLACE " +" " " said "${said}")
  if(expected STREQUAL "")
    if(NOT result EQUAL 0)
      message(FATAL_ERROR "${case}: the untouched documents failed the check:\n${said}")
    endif()
  elseif(result EQUAL 0)
    message(FATAL_ERROR "${case}: the check passed")
  elseif(NOT said MATCHES "${expected}")
    message(FATAL_ERROR "${case}: the check failed without saying '${expected}':\n${said}")
  endif()
  message(STATUS "${case}: as expected")
endfunction()

function(doctor document from to)
  file(READ ${WORK_DIR}/${document} text)
  string(FIND "${text}" "${from}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "self-test: ${document} no longer holds '${from}' to doctor")
  endif()
  string(REPLACE "${from}" "${to}" text "${text}")
  file(WRITE ${WORK_DIR}/${document} "${text}")
endfunction()

copy_documents()
check("untouched copy" "")

copy_documents()
file(APPEND ${WORK_DIR}/docs/guide.md "\nSee `examples/no_such_example.cpp`.\n")
check("a missing repository path in docs/guide.md" "docs/guide.md quotes examples/no_such_example.cpp")

copy_documents()
file(APPEND ${WORK_DIR}/docs/reference.md "\nSee `reduce/no_such_backend.hpp`.\n")
check("a missing library path in docs/reference.md" "docs/reference.md quotes reduce/no_such_backend.hpp")

copy_documents()
doctor(README.md "adam.lr = 0.05;" "adam.lr = 0.5;")
check("an altered snippet in README.md" "README.md: the snippet after <!-- snippet: examples/minimal_host.cpp --> is not")

copy_documents()
file(APPEND ${WORK_DIR}/benchmarks/README.md "\n[results](results/no-such-run/README.md)\n")
check("a broken link in benchmarks/README.md" "benchmarks/README.md links to results/no-such-run/README.md")

copy_documents()
doctor(README.md "<!-- snippet: examples/minimal_host.cpp -->" "")
check("a README without the minimal program" "expected the snippet of examples/minimal_host.cpp")

copy_documents()
string(REPEAT "word " 1500 padding)
file(APPEND ${WORK_DIR}/README.md "\n${padding}\n")
check("a README past 1,500 words" "README.md has [0-9]+ words")

file(REMOVE_RECURSE ${WORK_DIR})
