# The ATTNLAB_ONEDNN switch: oneDNN (Debian's libdnnl-dev) as the engine of float GEMMs
# (attnlab/blas.hpp: blas::gemm, chosen at run time by ATTNLAB_GEMM). AUTO builds it in when
# find_package(dnnl) finds it, ON requires it, OFF leaves it out. OpenBLAS is always linked: it runs
# the double GEMMs and every GEMM when oneDNN is left out or ATTNLAB_GEMM=openblas. Debian's
# package config of oneDNN 2.6 asks for OpenCL's headers (its GPU runtime), so .ci/deps.sh installs
# ocl-icd-opencl-dev beside it. Sets ATTNLAB_WITH_ONEDNN; attnlab_add_onednn(target source) links
# it and defines ATTNLAB_WITH_ONEDNN in that one source.
set(ATTNLAB_WITH_ONEDNN OFF)
if(NOT ATTNLAB_ONEDNN STREQUAL "OFF")
  find_package(dnnl CONFIG QUIET)
  if(TARGET DNNL::dnnl)
    set(ATTNLAB_WITH_ONEDNN ON)
  elseif(ATTNLAB_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "ATTNLAB_ONEDNN=ON but find_package(dnnl) found no oneDNN: install Debian's "
                        "libdnnl-dev and ocl-icd-opencl-dev (.ci/deps.sh does), or configure with "
                        "-DATTNLAB_ONEDNN=OFF")
  endif()
endif()
message(STATUS "attnlab: ATTNLAB_ONEDNN=${ATTNLAB_ONEDNN}, oneDNN GEMM engine built: ${ATTNLAB_WITH_ONEDNN}"
               " ${dnnl_VERSION}")

function(attnlab_add_onednn target source)
  if(ATTNLAB_WITH_ONEDNN)
    set_property(SOURCE "${source}" APPEND PROPERTY COMPILE_DEFINITIONS ATTNLAB_WITH_ONEDNN)
    target_link_libraries(${target} PRIVATE DNNL::dnnl)
  endif()
endfunction()
