# ctest splits a discovered test name at ';' (a CMake list): the parts become tests that run nothing
# and pass, and the case itself never runs. A '[' or ']' unbalances the list that
# doctest_discover_tests writes, and the test file fails to load. attnlab_check_test_names refuses
# such names in the sources it is given. tests/CMakeLists.txt calls it at configure time on the
# sources it globbed, and again as a build step whenever a test source changes (this file run as
# `cmake -P` with ATTNLAB_TEST_DIR and ATTNLAB_STAMP: every .cpp under the folder), since an
# incremental build does not configure again.
function(attnlab_check_test_names)
  foreach(source IN LISTS ARGN)
    file(STRINGS "${source}" bad_names REGEX "TEST_CASE[A-Z_]*\\(\"[^\"]*[][;]")
    if(bad_names)
      message(FATAL_ERROR
              "${source}: a test name contains ';', '[' or ']', which ctest mangles: ${bad_names}")
    endif()
  endforeach()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  file(GLOB_RECURSE sources "${ATTNLAB_TEST_DIR}/*.cpp")
  attnlab_check_test_names(${sources})
  file(TOUCH "${ATTNLAB_STAMP}")
endif()
