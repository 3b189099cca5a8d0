# The ATTNLAB_MPI switch: data-parallel training across processes (attnlab/distributed.hpp).
# AUTO builds MPI support when find_package(MPI) finds a C++-capable MPI (Debian: libopenmpi-dev),
# ON requires it, OFF leaves it out. Sets ATTNLAB_WITH_MPI; attnlab_add_mpi(target) links it.
set(ATTNLAB_WITH_MPI OFF)
if(NOT ATTNLAB_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(ATTNLAB_WITH_MPI ON)
  elseif(ATTNLAB_MPI STREQUAL "ON")
    message(FATAL_ERROR "ATTNLAB_MPI=ON but find_package(MPI) found no C++ MPI: install Debian's "
                        "libopenmpi-dev and openmpi-bin (.ci/deps.sh does), or configure with "
                        "-DATTNLAB_MPI=OFF")
  endif()
endif()
message(STATUS "attnlab: ATTNLAB_MPI=${ATTNLAB_MPI}, MPI support built: ${ATTNLAB_WITH_MPI}")

function(attnlab_add_mpi target source)
  if(ATTNLAB_WITH_MPI)
    set_property(SOURCE "${source}" APPEND PROPERTY COMPILE_DEFINITIONS ATTNLAB_WITH_MPI)
    target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
  endif()
endfunction()
