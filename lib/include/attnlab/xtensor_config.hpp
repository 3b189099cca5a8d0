// xtensor's configuration for attnlab's types, included by every attnlab header before any xtensor
// header (and by attnlab.pc's -include, so a pkg-config build needs no function-like macro on its
// command line). It pins xtensor's default allocator and alignment to 32 bytes whatever the
// consumer's -march, so xt::xtensor is the library's type (cmake/AttnlabMarch.cmake says why). A
// translation unit that included xtensor first with other settings fails to compile here, with
// the fix in the message, instead of linking against functions of another type.
#pragma once

#include <type_traits>

#ifndef XTENSOR_USE_XSIMD
#define XTENSOR_USE_XSIMD
#endif
#ifndef XTENSOR_DEFAULT_ALIGNMENT
#define XTENSOR_DEFAULT_ALIGNMENT 32
#endif

#include <xsimd/xsimd.hpp>

#ifndef XTENSOR_DEFAULT_ALLOCATOR
#define XTENSOR_DEFAULT_ALLOCATOR(T) xsimd::aligned_allocator<T, 32>
#endif

#include <xtensor/xtensor_config.hpp>

static_assert(
    XTENSOR_DEFAULT_ALIGNMENT == 32 &&
        std::is_same_v<XTENSOR_DEFAULT_ALLOCATOR(double), xsimd::aligned_allocator<double, 32>>,
    "attnlab: xtensor was configured before attnlab/xtensor_config.hpp with another "
    "allocator or alignment: include attnlab's headers before xtensor's, or compile with "
    "the flags of attnlab.pc or the CMake target attnlab::attnlab");
