# Doc snippets: every C++ block in README.md and docs/*.md must equal a fenced region
# (// example-begin NAME ... // example-end NAME) of a test file that kvsift_tests compiles and
# runs (tests/docs/doc_snippets_test.cpp). The self-test breaks copies of the docs on purpose
# and requires the check to fail on each. Included from the top-level CMakeLists.txt.

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME kvsift_doc_snippets
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/docs/check_snippets.py"
                   --root "${PROJECT_SOURCE_DIR}")
  add_test(NAME kvsift_doc_snippets_selftest
           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tests/docs/check_snippets.py"
                   --root "${PROJECT_SOURCE_DIR}" --self-test)
else()
  message(STATUS "kvsift: no python3 found; the doc snippet check (kvsift_doc_snippets) is "
                 "not registered")
endif()
