# Install rules: the library, its headers and a CMake package (config, targets, version file), so
# that an outside project can write find_package(attnlab) and link attnlab::attnlab; and the
# attnlab CLI (bin/attnlab) when it is built. The training application (lib/app) and the emulated
# backend are internal: linked into the CLI and the tests, never installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ATTNLAB_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/attnlab")
# Substituted into the config: a static attnlab's consumers link BLAS themselves.
get_target_property(ATTNLAB_LIBRARY_TYPE attnlab TYPE)

# With the CUDA backend, the static attnlab_cuda is part of the link interface: export it too.
set(ATTNLAB_EXPORTED_TARGETS attnlab)
if(TARGET attnlab_cuda)
  list(APPEND ATTNLAB_EXPORTED_TARGETS attnlab_cuda)
endif()
install(TARGETS ${ATTNLAB_EXPORTED_TARGETS} EXPORT attnlabTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY "${PROJECT_SOURCE_DIR}/lib/include/attnlab" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The GPU kernels an attention program instantiates in its user's own .cu file
# (attnlab/cuda_kernels/attention_program_kernels.cuh and what it includes): installed with or
# without the CUDA backend, since they are source for the user's nvcc.
set(ATTNLAB_PROGRAM_KERNEL_HEADERS attention_program_kernels.cuh attention_fused_kernels.cuh
    attention_fused_tiles.cuh attention_program_device.cuh attention_reference_kernels.cuh
    device_compat.cuh reduce.cuh)
list(TRANSFORM ATTNLAB_PROGRAM_KERNEL_HEADERS PREPEND "${PROJECT_SOURCE_DIR}/lib/backends/cuda/")
install(FILES ${ATTNLAB_PROGRAM_KERNEL_HEADERS}
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnlab/cuda_kernels)
if(TARGET attnlab_cli)
  # A shared attnlab is found next to bin/ (lib/); a static one is linked in.
  set_target_properties(attnlab_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS attnlab_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT attnlabTargets NAMESPACE attnlab:: DESTINATION ${ATTNLAB_INSTALL_CMAKEDIR})

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/attnlabConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/attnlabConfig.cmake" INSTALL_DESTINATION ${ATTNLAB_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/attnlabConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/attnlabConfig.cmake"
              "${PROJECT_BINARY_DIR}/attnlabConfigVersion.cmake"
        DESTINATION ${ATTNLAB_INSTALL_CMAKEDIR})

# pkg-config (attnlab.pc, beside the CMake package): the same usage requirements as attnlab::attnlab
# (C++20, OpenMP, xtensor with xsimd and its aligned allocator) in flags; a static attnlab also
# lists OpenBLAS, oneDNN when it is built in, and, with the CUDA backend, attnlab_cuda, cuBLAS and
# the static CUDA runtime.
file(RELATIVE_PATH ATTNLAB_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" ATTNLAB_PC_TO_PREFIX "${ATTNLAB_PC_TO_PREFIX}")
# xtensor's allocator comes from the installed attnlab/xtensor_config.hpp, forced first into every
# translation unit: a function-like macro in Cflags would be escaped by pkg-config (\< \>) and
# reach the compiler with its backslashes through an unquoted $(pkg-config ...) in a shell.
set(ATTNLAB_PC_CFLAGS "-DXTENSOR_USE_XSIMD -DXTENSOR_DEFAULT_ALIGNMENT=32 -include attnlab/xtensor_config.hpp")
set(ATTNLAB_PC_REQUIRES "")
set(ATTNLAB_PC_LIBS "")
if(TARGET attnlab_cuda)
  string(APPEND ATTNLAB_PC_CFLAGS " -DATTNLAB_HAS_CUDA=1")
endif()
if(ATTNLAB_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  if(TARGET attnlab_cuda)
    set(ATTNLAB_PC_LIBS "-lattnlab_cuda -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart_static -ldl -lrt -lpthread")
  endif()
  set(ATTNLAB_PC_REQUIRES "openblas")
  if(ATTNLAB_WITH_ONEDNN)  # oneDNN ships no pkg-config file
    string(APPEND ATTNLAB_PC_LIBS " -ldnnl")
  endif()
  if(ATTNLAB_WITH_MPI)
    string(APPEND ATTNLAB_PC_REQUIRES " ompi-c")
  endif()
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/attnlab.pc.in" "${PROJECT_BINARY_DIR}/attnlab.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/attnlab.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
