#include "alloc_count.hpp"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

extern "C" {
void* __real_malloc(std::size_t size);
void* __real_calloc(std::size_t n, std::size_t size);
void* __real_realloc(void* p, std::size_t size);
void __real_free(void* p);
int __real_posix_memalign(void** p, std::size_t alignment, std::size_t size);
void* __real_aligned_alloc(std::size_t alignment, std::size_t size);
}

namespace {
std::atomic<std::ptrdiff_t> g_live{0};
std::atomic<std::ptrdiff_t> g_peak{0};
std::atomic<std::ptrdiff_t> g_base{0};

void on_alloc(void* p) {
  if (!p) return;
  const auto now = g_live.fetch_add(static_cast<std::ptrdiff_t>(malloc_usable_size(p))) +
                   static_cast<std::ptrdiff_t>(malloc_usable_size(p));
  auto peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void on_free(void* p) {
  if (p) g_live.fetch_sub(static_cast<std::ptrdiff_t>(malloc_usable_size(p)));
}
}  // namespace

extern "C" {
void* __wrap_malloc(std::size_t size) {
  void* p = __real_malloc(size);
  on_alloc(p);
  return p;
}
void* __wrap_calloc(std::size_t n, std::size_t size) {
  void* p = __real_calloc(n, size);
  on_alloc(p);
  return p;
}
void* __wrap_realloc(void* old, std::size_t size) {
  on_free(old);
  void* p = __real_realloc(old, size);
  on_alloc(p ? p : (size ? nullptr : nullptr));
  return p;
}
void __wrap_free(void* p) {
  on_free(p);
  __real_free(p);
}
int __wrap_posix_memalign(void** p, std::size_t alignment, std::size_t size) {
  const int rc = __real_posix_memalign(p, alignment, size);
  if (rc == 0) on_alloc(*p);
  return rc;
}
void* __wrap_aligned_alloc(std::size_t alignment, std::size_t size) {
  void* p = __real_aligned_alloc(alignment, size);
  on_alloc(p);
  return p;
}
}

// operator new/delete through the counted malloc/free (these calls are wrapped at link time).
void* operator new(std::size_t size) {
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return operator new(size);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace attnlab::bench {

std::ptrdiff_t live_bytes() {
  return g_live.load();
}

void reset_peak() {
  g_base.store(g_live.load());
  g_peak.store(g_live.load());
}

std::ptrdiff_t peak_bytes() {
  return g_peak.load() - g_base.load();
}

}  // namespace attnlab::bench
