# ATTNLAB_MARCH (-march) and xsimd: one setting for every translation unit this project builds, and
# none forced on the consumers of the installed package.
#
# attnlab_use_march(target) gives `target`'s own translation units -march=${ATTNLAB_MARCH} (C++,
# and nvcc's host compiler). The library, the CUDA backend, the emulated backend, the application,
# the CLI, the tests, the benchmarks, the fuzzers and the examples all call it, so everything built
# here agrees: the library is bit-identical however it is linked (same SIMD width, same reductions).
#
# The exported attnlab::attnlab carries no -march: a consumer compiles with its own flags. Mixing is
# safe because the types do not depend on the SIMD level: xtensor's default allocator (the
# container type of every Tensor in attnlab's API) and default alignment would otherwise follow
# -march (16 bytes for SSE2, 32 for AVX2, 64 for AVX-512), changing the type of xt::xtensor and so
# the mangled names of attnlab's functions. attnlab pins both to 32 bytes as PUBLIC definitions
# (attnlab_pin_xtensor_alignment), which is what x86-64-v3 chooses anyway; under another -march
# xsimd then uses unaligned loads on these buffers, which is correct. What still differs across
# -march is only the code of inline xtensor templates compiled on both sides; the linker keeps one
# copy of each, equivalent up to rounding (SIMD width changes the order of a sum). The CPU must
# support the library's -march (x86-64-v3: AVX2 and FMA) in any case. A consumer wanting the
# in-tree build's exact numbers compiles with -march=${attnlab_MARCH} (set by attnlabConfig.cmake).
#
# It also gives them -fno-math-errno: attnlab never reads errno, and with it GCC compiles std::sqrt
# as the instruction instead of a call guarded by a branch, so element loops that take a square
# root (AdamW's update) vectorise. The results are the same IEEE operations, bit for bit.
function(attnlab_use_march target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fno-math-errno>)
  if(ATTNLAB_MARCH)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-march=${ATTNLAB_MARCH}>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-march=${ATTNLAB_MARCH}>)
  endif()
endfunction()

# XTENSOR_USE_XSIMD and the pinned allocator and alignment (see above), PUBLIC on `target`.
# CMake refuses function-style definitions, so the allocator goes in as a compile option (GCC and
# Clang accept it).
function(attnlab_pin_xtensor_alignment target scope)
  target_compile_definitions(${target} ${scope} XTENSOR_USE_XSIMD XTENSOR_DEFAULT_ALIGNMENT=32)
  target_compile_options(${target} ${scope}
    "$<$<COMPILE_LANGUAGE:CXX>:-DXTENSOR_DEFAULT_ALLOCATOR(T)=xsimd::aligned_allocator<T,32>>")
endfunction()
