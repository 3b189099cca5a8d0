# ctest splits a discovered test name at ';' (a CMake list): the parts become tests that run nothing
# and pass, and the case itself never runs. A '[' or ']' unbalances the list that
# doctest_discover_tests writes, and the test file fails to load. attnlab_check_test_names refuses
# such names in every .cpp under a folder. tests/CMakeLists.txt calls it at configure time and again
# as a build step whenever a test source changes (this file run as `cmake -P` with
# ATTNLAB_TEST_DIR and ATTNLAB_STAMP), since an incremental build does not configure again.
function(attnlab_check_test_names dir)
  file(GLOB_RECURSE sources "${dir}/*.cpp")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" bad_names REGEX "TEST_CASE[A-Z_]*\\(\"[^\"]*[][;]")
    if(bad_names)
      message(FATAL_ERROR
              "${source}: a test name contains ';', '[' or ']', which ctest mangles: ${bad_names}")
    endif()
  endforeach()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  attnlab_check_test_names("${ATTNLAB_TEST_DIR}")
  file(TOUCH "${ATTNLAB_STAMP}")
endif()
