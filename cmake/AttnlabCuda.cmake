# The ATTNLAB_CUDA switch. AUTO builds the CUDA backend when nvcc is found (CUDACXX, PATH, or the
# standard /usr/local/cuda prefix, which CMake does not search on its own); ON requires it; OFF is CPU only.
#
# When the backend is built:
#   - lib/backends/cuda/*.cu and runtime.cpp form the static library attnlab_cuda, linked into
#     attnlab (without it, lib/backends/cuda/without_cuda.cpp answers "not built");
#   - architectures 80 and 90 (A100, H100/H200), unless CMAKE_CUDA_ARCHITECTURES is given;
#   - the CUDA runtime is linked statically (CUDA::cudart_static): binaries start on machines that
#     have no driver, and report "no device" at run time instead of failing to load;
#   - cuBLAS (shared when the toolkit ships it, else static) does the GEMMs;
#   - attnlab and its users see ATTNLAB_HAS_CUDA=1.
set(ATTNLAB_WITH_CUDA OFF)
if(NOT ATTNLAB_CUDA STREQUAL "OFF")
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER)
    find_program(ATTNLAB_NVCC nvcc HINTS /usr/local/cuda/bin /opt/cuda/bin)
    if(ATTNLAB_NVCC)
      set(CMAKE_CUDA_COMPILER "${ATTNLAB_NVCC}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  # nvcc must use the same host compiler as the C++ code (gcc 12 on Debian 12).
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "Host compiler of nvcc")
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90 CACHE STRING "CUDA architectures (A100, H100/H200)")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ATTNLAB_CUDA_FOUND ON)
  endif()
  if(ATTNLAB_CUDA STREQUAL "ON" AND NOT ATTNLAB_CUDA_FOUND)
    message(FATAL_ERROR "ATTNLAB_CUDA=ON but no working nvcc was found: set CUDACXX or install the CUDA "
                        "toolkit in /usr/local/cuda, or configure with -DATTNLAB_CUDA=OFF")
  endif()
  if(ATTNLAB_CUDA_FOUND)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static AND (TARGET CUDA::cublas OR TARGET CUDA::cublas_static))
      set(ATTNLAB_WITH_CUDA ON)
    elseif(ATTNLAB_CUDA STREQUAL "ON")
      message(FATAL_ERROR "ATTNLAB_CUDA=ON: nvcc ${CMAKE_CUDA_COMPILER} works, but the CUDA toolkit's "
                          "static runtime (libcudart_static) or cuBLAS was not found next to it")
    else()
      message(STATUS "attnlab: nvcc found but no cudart_static/cuBLAS: building CPU only")
    endif()
  endif()
endif()
if(ATTNLAB_WITH_CUDA)
  message(STATUS "attnlab: ATTNLAB_CUDA=${ATTNLAB_CUDA}, CUDA backend built: ON "
                 "(nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "attnlab: ATTNLAB_CUDA=${ATTNLAB_CUDA}, CUDA backend built: OFF")
endif()

# Builds attnlab_cuda from lib/backends/cuda and links it into `target` (the attnlab library).
function(attnlab_add_cuda_backend target)
  if(NOT ATTNLAB_WITH_CUDA)
    return()
  endif()
  file(GLOB sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/lib/backends/cuda/*.cu")
  list(APPEND sources "${PROJECT_SOURCE_DIR}/lib/backends/cuda/runtime.cpp")
  add_library(attnlab_cuda STATIC ${sources})
  # The kernels include only attnlab's device-safe headers (never xtensor): the public ones and the
  # ops' element math in lib/src/kernels. C++17 is what every supported nvcc accepts.
  target_include_directories(attnlab_cuda PRIVATE "${PROJECT_SOURCE_DIR}/lib/include"
                                                  "${PROJECT_SOURCE_DIR}/lib/src"
                                                  "${PROJECT_SOURCE_DIR}/lib/backends/cuda")
  set_target_properties(attnlab_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                CUDA_RUNTIME_LIBRARY Static)
  if(BUILD_SHARED_LIBS)
    set_target_properties(attnlab_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  target_compile_definitions(attnlab_cuda PRIVATE ATTNLAB_HAS_CUDA=1)
  target_compile_options(attnlab_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  attnlab_use_march(attnlab_cuda)
  # Shared cuBLAS loads without a driver too, and links far faster than the static archive.
  if(TARGET CUDA::cublas)
    set(cublas CUDA::cublas)
  else()
    set(cublas CUDA::cublas_static)
  endif()
  target_link_libraries(attnlab_cuda PUBLIC CUDA::cudart_static ${cublas})
  target_link_libraries(${target} PRIVATE attnlab_cuda)
  target_compile_definitions(${target} PUBLIC ATTNLAB_HAS_CUDA=1)
endfunction()
