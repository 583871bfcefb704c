# ctest examples.readme_snippets: the documents a user reads — README.md, every docs/*.md and
# benchmarks/README.md — say only what the repository holds.
# - Each fenced block that follows a line "<!-- snippet: PATH -->" is the file PATH, byte for byte, so
#   that every program a user copies is one CI compiles; README.md must quote examples/minimal_host.cpp.
# - Every repository path a document quotes in backticks (`examples/...`, `tests/...`, and library paths
#   such as `reduce/...` under include/towerpipe) exists; every relative Markdown link's target exists.
# - A build/default/examples/ binary it names is one examples/run.sh builds.
# - README.md stays a front door: at most 1,500 words (as wc -w counts them).
# Run as: cmake -DSOURCE_DIR=<towerpipe> [-DDOCS_DIR=<a copy of the documents>] -P readme_snippets.cmake
# DOCS_DIR (default SOURCE_DIR) is where the documents are read, at their repository paths; everything
# they name is looked up in SOURCE_DIR (the self-test, examples.readme_snippets_catch_what_they_guard,
# checks doctored copies that way).
if(NOT DEFINED DOCS_DIR)
  set(DOCS_DIR ${SOURCE_DIR})
endif()
file(GLOB guide_documents RELATIVE ${DOCS_DIR} ${DOCS_DIR}/docs/*.md)
set(documents README.md ${guide_documents} benchmarks/README.md)
set(library_folders "core|layout|data|optim|plan|kernels|wiring|trace|executor|cuda|comm|step|exec|reduce|io|pipeline")

set(snippets 0)
foreach(document IN LISTS documents)
  if(NOT EXISTS ${DOCS_DIR}/${document})
    message(FATAL_ERROR "${document} is missing")
  endif()
  file(READ ${DOCS_DIR}/${document} text)
  get_filename_component(document_dir ${SOURCE_DIR}/${document} DIRECTORY)

  # Quoted programs.
  string(REGEX MATCHALL "<!-- snippet: [^ ]+ -->" markers "${text}")
  foreach(marker IN LISTS markers)
    string(REGEX REPLACE "<!-- snippet: ([^ ]+) -->" "\\1" path "${marker}")
    string(FIND "${text}" "${marker}" at)
    string(SUBSTRING "${text}" ${at} -1 rest)
    if(NOT rest MATCHES "^[^\n]*-->\n```[a-z]*\n")
      message(FATAL_ERROR "${document}: no code block right after ${marker}")
    endif()
    string(REGEX REPLACE "^[^\n]*\n```[a-z]*\n" "" rest "${rest}")
    string(FIND "${rest}" "\n```\n" end)
    string(SUBSTRING "${rest}" 0 ${end} quoted)
    if(NOT EXISTS ${SOURCE_DIR}/${path})
      message(FATAL_ERROR "${document}: ${marker} quotes ${path}, which is not in the repository")
    endif()
    file(READ ${SOURCE_DIR}/${path} source)
    string(STRIP "${source}" source)
    if(NOT quoted STREQUAL source)
      message(FATAL_ERROR "${document}: the snippet after ${marker} is not ${path} as it is in the repository")
    endif()
    if(document STREQUAL "README.md" AND path STREQUAL "examples/minimal_host.cpp")
      set(readme_quotes_minimal TRUE)
    endif()
    math(EXPR snippets "${snippets} + 1")
  endforeach()

  # Quoted repository and library paths.
  string(REGEX MATCHALL "`(include|examples|tests|benchmarks|cmake|docs|\\.ci)/[][A-Za-z0-9_.*/-]+`" repository_paths "${text}")
  string(REGEX MATCHALL "`(${library_folders})/[A-Za-z0-9_.*/-]+`" library_paths "${text}")
  foreach(quoted IN LISTS repository_paths library_paths)
    string(REPLACE "`" "" path "${quoted}")
    set(base ${SOURCE_DIR})
    if(NOT path MATCHES "^(include|examples|tests|benchmarks|cmake|docs|\\.ci)/")
      set(base ${SOURCE_DIR}/include/towerpipe)
    endif()
    if(path MATCHES "[*]")
      file(GLOB found ${base}/${path})
    elseif(EXISTS ${base}/${path})
      set(found ${base}/${path})
    else()
      set(found "")
    endif()
    if(NOT found)
      message(FATAL_ERROR "${document} quotes ${path}, which is not in the repository")
    endif()
  endforeach()

  # Relative Markdown links (anchors dropped; web links are not checked).
  # (The "](" is replaced first: a bracket in a list element would stop CMake splitting the list there.)
  string(REPLACE "](" "<link>" linked "${text}")
  string(REGEX MATCHALL "<link>[^)#: ]+[)#]" links "${linked}")
  foreach(link IN LISTS links)
    string(REGEX REPLACE "^<link>([^)#]+)[)#]$" "\\1" target "${link}")
    if(NOT EXISTS ${document_dir}/${target})
      message(FATAL_ERROR "${document} links to ${target}, which is not in the repository")
    endif()
  endforeach()

  # Binaries of the main job.
  string(REGEX MATCHALL "build/default/examples/[A-Za-z0-9_]+" binaries "${text}")
  file(READ ${SOURCE_DIR}/examples/run.sh run_script)
  foreach(binary IN LISTS binaries)
    string(FIND "${run_script}" "${binary}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${document} names ${binary}, which examples/run.sh does not build")
    endif()
  endforeach()

  list(LENGTH repository_paths repository_count)
  list(LENGTH library_paths library_count)
  list(LENGTH links link_count)
  message(STATUS "${document}: ${repository_count} repository paths, ${library_count} library paths, ${link_count} links exist")
endforeach()

if(NOT readme_quotes_minimal)
  message(FATAL_ERROR "README.md: expected the snippet of examples/minimal_host.cpp, found none")
endif()
message(STATUS "${snippets} snippet(s) quoted verbatim")

# The front door's length, counted as wc -w does (runs of non-blank characters; list separators and
# brackets masked so that CMake's list splitting counts each word once).
file(READ ${DOCS_DIR}/README.md readme)
string(REGEX REPLACE "[][;\\\\]" "x" readme "${readme}")
string(REGEX MATCHALL "[^ \t\r\n]+" words "${readme}")
list(LENGTH words word_count)
if(word_count GREATER 1500)
  message(FATAL_ERROR "README.md has ${word_count} words; at most 1500 (the rest belongs in docs/)")
endif()
message(STATUS "README.md: ${word_count} words")
