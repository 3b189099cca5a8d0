# Builds and runs the outside project in this folder against attnlab; run by ctest with cmake -P.
#   -DMODE=package       installs the build tree at BUILD_DIR into WORK_DIR/prefix, builds and
#                        runs app.cpp with the flags of the installed attnlab.pc (pkg-config), then
#                        configures the project with find_package(attnlab) from that prefix
#   -DMODE=subdirectory  configures the project with add_subdirectory(SOURCE_DIR) and compiles
#                        app.cpp against the attnlab target; with -DFULL=ON it also builds the
#                        library from source (a minute of CPU), links and runs the program
# Other variables: SOURCE_DIR (attnlab checkout), BUILD_DIR (attnlab build tree), WORK_DIR (scratch),
# LIBDIR (CMAKE_INSTALL_LIBDIR), GENERATOR, CXX_COMPILER, BUILD_TYPE, JOBS, CLI (ON: the build tree
# has the attnlab CLI, so the prefix must have bin/attnlab).
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(consumer_build "${WORK_DIR}/consumer-${MODE}")
if(MODE STREQUAL "package")
  set(prefix "${WORK_DIR}/prefix")
  file(REMOVE_RECURSE "${prefix}" "${consumer_build}")
  run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
  foreach(f ${LIBDIR}/cmake/attnlab/attnlabConfig.cmake
            ${LIBDIR}/cmake/attnlab/attnlabConfigVersion.cmake
            ${LIBDIR}/cmake/attnlab/attnlabTargets.cmake include/attnlab/attnlab.hpp
            include/attnlab/optim/adamw.hpp
            include/attnlab/cuda_kernels/attention_program_kernels.cuh)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "cmake --install did not install ${f}")
    endif()
  endforeach()
  # The library's own headers only: the training application is internal.
  file(GLOB_RECURSE app_headers "${prefix}/include/attnlab/app/*" "${prefix}/include/attnlab/train/*")
  if(app_headers)
    message(FATAL_ERROR "cmake --install installed the application's headers: ${app_headers}")
  endif()
  # The installed package forces no -march on its consumers (cmake/AttnlabMarch.cmake).
  file(READ "${prefix}/${LIBDIR}/cmake/attnlab/attnlabTargets.cmake" targets)
  if(targets MATCHES "march")
    message(FATAL_ERROR "attnlabTargets.cmake passes -march to consumers")
  endif()
  # The CLI is installed and runs from the prefix.
  if(CLI)
    run_step("installed bin/attnlab --help" "${prefix}/bin/attnlab" --help)
    if(NOT step_output MATCHES "train")
      message(FATAL_ERROR "bin/attnlab --help printed no subcommands:\n${step_output}")
    endif()
  endif()
  # pkg-config: the installed attnlab.pc alone compiles, links and runs the same program.
  if(NOT EXISTS "${prefix}/${LIBDIR}/pkgconfig/attnlab.pc")
    message(FATAL_ERROR "cmake --install did not install ${LIBDIR}/pkgconfig/attnlab.pc")
  endif()
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf REQUIRED)
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
  run_step("pkg-config --cflags --libs attnlab" "${PKG_CONFIG_EXECUTABLE}" --cflags --libs attnlab)
  separate_arguments(pc_flags UNIX_COMMAND "${step_output}")
  file(MAKE_DIRECTORY "${consumer_build}")
  run_step("c++ app.cpp with pkg-config's flags" "${CXX_COMPILER}" -O1
           "${CMAKE_CURRENT_LIST_DIR}/app.cpp" -o "${consumer_build}/app-pkgconfig" ${pc_flags})
  run_step("run app-pkgconfig" "${consumer_build}/app-pkgconfig")
  if(NOT step_output MATCHES "attnlab consumer: .*: ok")
    message(FATAL_ERROR "pkg-config build: unexpected output: ${step_output}")
  endif()
  # The documented command as a user types it, through /bin/sh: pkg-config's output unquoted (a
  # function-like macro in it would reach the compiler with pkg-config's backslashes).
  file(MAKE_DIRECTORY "${consumer_build}/shell")
  file(COPY "${CMAKE_CURRENT_LIST_DIR}/app.cpp" DESTINATION "${consumer_build}/shell")
  run_step("/bin/sh: c++ app.cpp $(pkg-config --cflags --libs attnlab)" /bin/sh -c
           "cd '${consumer_build}/shell' && export PKG_CONFIG_PATH='${prefix}/${LIBDIR}/pkgconfig' && c++ app.cpp $(pkg-config --cflags --libs attnlab) && ./a.out")
  if(NOT step_output MATCHES "attnlab consumer: .*: ok")
    message(FATAL_ERROR "/bin/sh pkg-config build: unexpected output: ${step_output}")
  endif()
  set(how "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "subdirectory")
  # Kept between runs: the library build is incremental.
  set(how "-DATTNLAB_SOURCE_DIR=${SOURCE_DIR}" -DATTNLAB_CUDA=OFF)
else()
  message(FATAL_ERROR "MODE: expected package or subdirectory, got '${MODE}'")
endif()

run_step("configure (${MODE})" "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}" -B "${consumer_build}"
         -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
         ${how})
if(MODE STREQUAL "subdirectory")
  # As a subproject attnlab must not add its own tests, examples or install rules.
  file(STRINGS "${consumer_build}/CMakeCache.txt" own_targets
       REGEX "^ATTNLAB_(BUILD_TESTS|BUILD_EXAMPLES|INSTALL):BOOL=ON$")
  if(own_targets)
    message(FATAL_ERROR "attnlab as a subproject turned on: ${own_targets}")
  endif()
  if(NOT FULL)
    run_step("compile app.cpp (${MODE})" "${CMAKE_COMMAND}" --build "${consumer_build}" --target
             app_objects)
    message(STATUS "app.cpp compiled against attnlab::attnlab from add_subdirectory")
    return()
  endif()
endif()
run_step("build (${MODE})" "${CMAKE_COMMAND}" --build "${consumer_build}" --parallel ${JOBS})
run_step("run (${MODE})" "${consumer_build}/app")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "attnlab consumer: .*: ok")
  message(FATAL_ERROR "unexpected output: ${step_output}")
endif()
