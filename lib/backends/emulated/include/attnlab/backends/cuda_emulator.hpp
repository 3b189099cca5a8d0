// A CPU emulation of the CUDA thread model, just enough to run attnlab's kernels
// (lib/backends/cuda/*.cuh) with the C++ compiler on a machine without a GPU:
//   - the blocks of the grid run one after another; each CUDA thread of a block is a fiber (its own
//     stack) on the calling OS thread, and the fibers of a block take turns: a fiber runs until it
//     waits at a barrier (or ends), then the next runnable one runs. Switching fibers is a dozen
//     instructions, so a launch costs microseconds, where one std::thread per CUDA thread cost
//     milliseconds (thread creation, and a futex round trip per thread at every barrier);
//   - __syncthreads is a barrier over the block, __shfl_xor_sync a lane exchange through a buffer
//     and a barrier of the warp's 32 threads; a barrier that can never complete (threads
//     that took different paths) aborts with a message instead of hanging;
//   - shared memory is one buffer per block, filled with 0xFF bytes (NaN for float and double) so
//     that a kernel reading shared memory it never wrote produces NaN;
//   - the tensor-core operations of sm_80 (spelled for kernels in device_compat.cuh): mma.sync
//     m16n8k16 (bf16 or fp16 inputs, fp32 accumulators) and ldmatrix (x1, x2, x4, .trans) are
//     warp exchanges like the shuffle: each lane deposits its registers (or its row address),
//     the warp meets at a barrier, each lane takes its own elements in the PTX ISA's fragment
//     layouts, and the warp meets again. So a value in the wrong register gives a wrong product,
//     as on the GPU. mma sums in fp32 in a stated order (mma_m16n8k16), which may differ from the
//     tensor cores' (undocumented) in the last bits. They need whole warps of 32 threads;
//   - cp.async copies (4, 8, 16 bytes, global to shared) are performed at the issuing thread's
//     cp.async.wait_group that covers their commit group; until then the destination holds 0xFF
//     bytes, so a kernel that reads it before the wait (and a barrier) reads NaN (cp_async);
//   - Bf16 and Half hold 16-bit floats (round-to-nearest-even conversions) for those operations.
// Under AddressSanitizer the fibers tell it about every switch (__sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber, with a fake stack per fiber for detect_stack_use_after_return).
// Under ThreadSanitizer and off x86-64, every CUDA thread is a std::thread instead and the barriers
// are std::barriers: the same semantics, slower.
// It checks the kernels' indexing, tiling, masking, synchronisation structure, fragment layouts
// and arithmetic; not their speed, not nvcc's code generation, and not the inline PTX of
// device_compat.cuh (which only nvcc compiles). 1-D blocks only (all of attnlab's kernels).
//
// Include this header before any kernel header, in a translation unit that includes no CUDA header.
// Everything here is inline: the emulated backend and the kernel tests include it.
#pragma once

#define ATTNLAB_CUDA_EMULATION 1

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__SANITIZE_THREAD__) || !defined(__x86_64__)
#define ATTNLAB_EMU_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTNLAB_EMU_THREADS 1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ATTNLAB_EMU_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTNLAB_EMU_ASAN_FIBERS 1
#endif
#endif
#if defined(ATTNLAB_EMU_ASAN_FIBERS)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
// A function that gets no frame on AddressSanitizer's fake stack (Scheduler::switch_to).
#define ATTNLAB_EMU_NO_FAKE_FRAME __attribute__((no_sanitize_address, noinline))
#else
#define ATTNLAB_EMU_NO_FAKE_FRAME
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(threads)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace attnlab::emu {

constexpr std::size_t kWarp = 32;
constexpr std::size_t kStaticSharedBytes = 16 * 1024;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda emulator: %s\n", what);
  std::abort();
}

// Shared memory of one block, NaN-filled before each block runs.
struct SharedMemory {
  std::vector<double> dynamic_shared, static_shared;

  SharedMemory(std::size_t dynamic_bytes)
      : dynamic_shared((dynamic_bytes + 7) / 8), static_shared(kStaticSharedBytes / 8) {
    poison();
  }

  // memset of an empty vector's data() (null) is undefined behaviour (UBSan, preset asan).
  void poison() {
    if (!dynamic_shared.empty()) {
      std::memset(dynamic_shared.data(), 0xFF, dynamic_shared.size() * sizeof(double));
    }
    if (!static_shared.empty()) {
      std::memset(static_shared.data(), 0xFF, static_shared.size() * sizeof(double));
    }
  }
};

// Whether [p, p + bytes) lies inside `buffer`.
inline bool inside(const std::vector<double>& buffer, const void* p, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(buffer.data());
  const auto end = begin + buffer.size() * sizeof(double);
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  return at >= begin && at <= end && bytes <= end - at;
}

// 32-bit words per lane in the warp-collective exchange (mma: 4 + 2 + 4; ldmatrix: 2).
constexpr std::size_t kExchangeWords = 10;

// One thread's cp.async copies not yet performed: deferred until a cp.async.wait_group (or
// wait_all) covers their commit group. `committed` counts the thread's commit groups so far.
struct AsyncCopy {
  static constexpr std::size_t kUncommitted = static_cast<std::size_t>(-1);
  unsigned char* dst;
  const unsigned char* src;
  std::size_t bytes, src_bytes;
  std::size_t group;  // kUncommitted until the next commit_group
};
struct AsyncCopies {
  std::vector<AsyncCopy> pending;
  std::size_t committed = 0;
  void clear() {
    pending.clear();
    committed = 0;
  }
};

#if defined(ATTNLAB_EMU_THREADS)

// ---- one std::thread per CUDA thread ----------------------------------------------------------

// The state shared by the threads of one block.
struct Block : SharedMemory {
  std::barrier<> barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<double> exchange;  // two 8-byte slots per thread for shuffles (see shfl_xor)
  std::vector<std::uint32_t> warp_exchange;  // kExchangeWords per thread (see warp_collective)

  Block(unsigned threads, std::size_t dynamic_bytes)
      : SharedMemory(dynamic_bytes),
        barrier(threads),
        exchange(2 * std::size_t{threads}),
        warp_exchange(kExchangeWords * threads) {
    for (unsigned w = 0; w < (threads + kWarp - 1) / kWarp; ++w) {
      warp_barriers.push_back(std::make_unique<std::barrier<>>(kWarp));
    }
  }
  void sync_block() { barrier.arrive_and_wait(); }
  void sync_warp(unsigned warp) { warp_barriers[warp]->arrive_and_wait(); }
};

inline thread_local Block* current_block = nullptr;
inline thread_local std::size_t static_shared_used = 0;
inline thread_local std::size_t shuffle_count = 0;
inline thread_local AsyncCopies async_copy_state;
inline std::size_t& shared_used() {
  return static_shared_used;
}
inline std::size_t& shuffles() {
  return shuffle_count;
}
inline AsyncCopies& async_copies() {
  return async_copy_state;
}

// kernel<<<grid, block, dynamic_bytes>>>(args...), synchronously. One std::thread per CUDA thread
// of a block, reused for every block of the grid in turn.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_bytes,
            Args... args) {
  Block state(block.x, dynamic_bytes);
  std::vector<std::thread> threads;
  threads.reserve(block.x);
  for (unsigned t = 0; t < block.x; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = dim3(t);
      blockDim = block;
      gridDim = grid;
      current_block = &state;
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          blockIdx = dim3(bx, by);
          static_shared_used = 0;
          shuffle_count = 0;
          async_copy_state.clear();  // copies never waited for die with the block's shared memory
          kernel(args...);
          // The next block starts with fresh (NaN-filled) shared memory.
          state.barrier.arrive_and_wait();
          if (t == 0) state.poison();
          state.barrier.arrive_and_wait();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

#else

// ---- one fiber per CUDA thread ------------------------------------------------------------------

// Naked: the body is the assembly alone. noipa: callers must assume the call reads and writes any
// memory (threadIdx among it), as they would for a function in another library.
#if defined(__clang__)
#define ATTNLAB_EMU_OPAQUE __attribute__((naked, noinline))
#else
#define ATTNLAB_EMU_OPAQUE __attribute__((naked, noipa))
#endif

// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save, switches to the stack `next` (saved the same way) and returns on it.
// System V x86-64 ABI: every other register is caller-saved, so a plain call is a full switch.
ATTNLAB_EMU_OPAQUE inline void switch_stack(void** /*save*/, void* /*next*/) {
  asm volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $16, %rsp\n\t"
      "stmxcsr 8(%rsp)\n\t"
      "fnstcw 12(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr 8(%rsp)\n\t"
      "fldcw 12(%rsp)\n\t"
      "addq $16, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

struct Fiber;
inline void fiber_main(Fiber* fiber);

// The first code a new fiber runs: its Fiber* was placed in r12.
ATTNLAB_EMU_OPAQUE inline void fiber_start() {
  asm volatile(
      "movq %r12, %rdi\n\t"
      "movq %r13, %rax\n\t"
      "callq *%rax\n\t"
      "ud2\n\t");
}

// A barrier of `expected` fibers: a fiber waiting on it may run again once its phase has moved on.
struct FiberBarrier {
  unsigned expected = 0, arrived = 0;
  std::size_t phase = 0;
};

struct Fiber {
  static constexpr std::size_t kStackBytes = 256 * 1024;
  std::unique_ptr<unsigned char[]> stack{new unsigned char[kStackBytes]};
  void* sp = nullptr;
  unsigned thread = 0;
  std::size_t shared_used = 0;
  std::size_t shuffles = 0;
  AsyncCopies async;
  const FiberBarrier* waiting = nullptr;  // null: runnable
  std::size_t waiting_phase = 0;
  bool done = false;
  // AddressSanitizer's fake stack of this fiber (detect_stack_use_after_return), kept from one run
  // to the next: a fresh one per run would cost an mmap and munmap each time.
  void* fake_stack = nullptr;
};

// The fibers of one OS thread, reused by every launch of that thread: one per CUDA thread of the
// largest block launched so far.
struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
  void (*body)(void*) = nullptr;  // runs the kernel once, for the current thread and block
  void* body_context = nullptr;
  FiberBarrier block_barrier;
  std::vector<FiberBarrier> warp_barriers;
  std::vector<double> exchange;
  std::vector<std::uint32_t> warp_exchange;

  // Starts fiber f afresh: its first switch_stack returns into fiber_start.
  void reset(Fiber& f) {
#if defined(ATTNLAB_EMU_ASAN_FIBERS)
    // The frames of the fiber's last run that never returned (fiber_main's final switch, at the
    // top of the stack) left poisoned redzones behind.
    constexpr std::size_t kTop = 16 * 1024;
    ASAN_UNPOISON_MEMORY_REGION(f.stack.get() + Fiber::kStackBytes - kTop, kTop);
#endif
    auto top = reinterpret_cast<std::uintptr_t>(f.stack.get() + Fiber::kStackBytes);
    top &= ~std::uintptr_t(15);  // 16-aligned at fiber_start, so its call aligns the callee's frame
    auto* frame = reinterpret_cast<std::uint64_t*>(top) - 9;
    std::memset(frame, 0, 9 * sizeof(std::uint64_t));
    unsigned mxcsr = 0;
    unsigned short fpu_cw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpu_cw));
    std::memcpy(reinterpret_cast<unsigned char*>(frame) + 8, &mxcsr, 4);
    std::memcpy(reinterpret_cast<unsigned char*>(frame) + 12, &fpu_cw, 2);
    frame[2] = 0;                                              // r15
    frame[3] = 0;                                              // r14
    frame[4] = reinterpret_cast<std::uint64_t>(&fiber_main);   // r13
    frame[5] = reinterpret_cast<std::uint64_t>(&f);            // r12
    frame[6] = 0;                                              // rbx
    frame[7] = 0;                                              // rbp
    frame[8] = reinterpret_cast<std::uint64_t>(&fiber_start);  // return address
    f.sp = frame;
    f.shared_used = 0;
    f.shuffles = 0;
    f.async.clear();  // copies never waited for die with the last block's shared memory
    f.waiting = nullptr;
    f.done = false;
  }

  unsigned threads = 0;  // of the block being run

#if defined(ATTNLAB_EMU_ASAN_FIBERS)
  // AddressSanitizer: the bounds of the OS thread's own stack (the scheduler's), learnt at the
  // first switch away from it, and whether the switch under way leaves it.
  const void* os_stack_bottom = nullptr;
  std::size_t os_stack_size = 0;
  bool leaving_scheduler = false;

  // Called first thing on a context that a switch has just entered (finish_switch_fiber).
  void entered(void* fake_stack) {
    const void* from_bottom = nullptr;
    std::size_t from_size = 0;
    __sanitizer_finish_switch_fiber(fake_stack, &from_bottom, &from_size);
    if (leaving_scheduler) {
      os_stack_bottom = from_bottom;
      os_stack_size = from_size;
      leaving_scheduler = false;
    }
  }
#endif

  // switch_stack(save, next->sp) (next null: back to the scheduler), telling AddressSanitizer.
  // `finished`: the running fiber `self` ends here; its fake stack waits in self->fake_stack for
  // its next run (fiber_main). Not instrumented under AddressSanitizer: its `fake_stack` has its
  // address taken, so it would get a frame on the fiber's fake stack, and a finishing fiber never
  // returns from this call. That frame would stay allocated in the kept fake stack, one per run,
  // until its size class filled and every later frame of that class scanned the whole class for
  // a free slot (__asan_stack_malloc_N was then most of an emulated test's time).
  ATTNLAB_EMU_NO_FAKE_FRAME void switch_to(void** save, Fiber* next,
                                           [[maybe_unused]] Fiber* finished) {
#if defined(ATTNLAB_EMU_ASAN_FIBERS)
    void* fake_stack = nullptr;
    void** keep = finished != nullptr ? &finished->fake_stack : &fake_stack;
    leaving_scheduler = save == &scheduler_sp;
    if (next != nullptr) {
      __sanitizer_start_switch_fiber(keep, next->stack.get(), Fiber::kStackBytes);
    } else {
      __sanitizer_start_switch_fiber(keep, os_stack_bottom, os_stack_size);
    }
    switch_stack(save, next != nullptr ? next->sp : scheduler_sp);
    entered(fake_stack);
#else
    switch_stack(save, next != nullptr ? next->sp : scheduler_sp);
#endif
  }

  bool runnable(const Fiber& f) const {
    return !f.done && (f.waiting == nullptr || f.waiting->phase != f.waiting_phase);
  }

  // Leaves the running fiber (or the scheduler), saving its stack pointer in *save: switches to the
  // next runnable fiber after `from` in thread order, or back to the scheduler when none is left.
  // Fibers hand over to each other directly; the scheduler only starts and ends blocks.
  void switch_from(void** save, unsigned from, bool finished = false) {
    Fiber* self = finished ? current : nullptr;
    for (unsigned step = 1; step <= threads; ++step) {
      const unsigned t = (from + step) % threads;
      Fiber& f = *fibers[t];
      if (!runnable(f)) continue;
      f.waiting = nullptr;
      current = &f;
      threadIdx = dim3(t);
      switch_to(save, &f, self);
      return;
    }
    current = nullptr;
    switch_to(save, nullptr, self);
  }

  // Runs one block: every fiber from the start of the kernel to its end.
  void run_block() {
    for (unsigned t = 0; t < threads; ++t) {
      fibers[t]->thread = t;
      reset(*fibers[t]);
    }
    switch_from(&scheduler_sp, threads - 1);  // back here once no fiber can run
    for (unsigned t = 0; t < threads; ++t) {
      if (!fibers[t]->done) {
        fail(
            "deadlock: threads of a block wait at barriers that can never complete (a "
            "__syncthreads or shuffle not reached by every thread)");
      }
    }
  }

  // Called on a fiber: arrive at `barrier`; hand over to another fiber unless this arrival
  // completes it.
  void arrive_and_wait(FiberBarrier& barrier) {
    Fiber& f = *current;
    if (++barrier.arrived == barrier.expected) {
      barrier.arrived = 0;
      ++barrier.phase;
      return;
    }
    f.waiting = &barrier;
    f.waiting_phase = barrier.phase;
    switch_from(&f.sp, f.thread);
  }
};

inline thread_local Scheduler scheduler;

inline void fiber_main(Fiber* fiber) {
#if defined(ATTNLAB_EMU_ASAN_FIBERS)
  scheduler.entered(fiber->fake_stack);  // the fake stack of its last run, if any
#endif
  scheduler.body(scheduler.body_context);
  fiber->done = true;
  scheduler.switch_from(&fiber->sp, fiber->thread, /*finished=*/true);
  fail("a finished fiber was resumed");
}

// The state seen by the kernels' shared-memory and barrier hooks.
struct Block {
  std::vector<double>& exchange;
  std::vector<std::uint32_t>& warp_exchange;
  std::vector<double>& dynamic_shared;
  std::vector<double>& static_shared;
  void sync_block() { scheduler.arrive_and_wait(scheduler.block_barrier); }
  void sync_warp(unsigned warp) { scheduler.arrive_and_wait(scheduler.warp_barriers[warp]); }
};

inline thread_local Block* current_block = nullptr;
inline std::size_t& shared_used() {
  return scheduler.current->shared_used;
}
inline std::size_t& shuffles() {
  return scheduler.current->shuffles;
}
inline AsyncCopies& async_copies() {
  return scheduler.current->async;
}

// kernel<<<grid, block, dynamic_bytes>>>(args...), synchronously: the blocks of the grid one after
// another, each as blockDim.x fibers on the calling thread.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_bytes,
            Args... args) {
  Scheduler& s = scheduler;
  if (s.current != nullptr) fail("launch from inside a kernel");
  if (block.x == 0) fail("launch with a block of 0 threads");
  const unsigned threads = block.x;
  while (s.fibers.size() < threads) s.fibers.push_back(std::make_unique<Fiber>());
  SharedMemory shared(dynamic_bytes);
  s.exchange.assign(2 * std::size_t{threads}, 0.0);
  s.warp_exchange.assign(kExchangeWords * threads, 0);
  s.threads = threads;
  s.block_barrier = FiberBarrier{threads, 0, 0};
  s.warp_barriers.assign((threads + kWarp - 1) / kWarp,
                         FiberBarrier{static_cast<unsigned>(kWarp), 0, 0});
  Block state{s.exchange, s.warp_exchange, shared.dynamic_shared, shared.static_shared};
  auto call = [&] { kernel(args...); };
  s.body = [](void* context) { (*static_cast<decltype(call)*>(context))(); };
  s.body_context = &call;
  current_block = &state;
  blockDim = block;
  gridDim = grid;
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      blockIdx = dim3(bx, by);
      s.run_block();
      shared.poison();  // the next block starts with fresh (NaN-filled) shared memory
    }
  }
  current_block = nullptr;
  s.body = nullptr;
  s.body_context = nullptr;  // `call` is about to go
}

#endif

inline unsigned char* dynamic_shared() {
  return reinterpret_cast<unsigned char*>(current_block->dynamic_shared.data());
}

// Each thread declares the kernel's static shared arrays in the same order, so each gets the same
// address for the same declaration.
template <class T>
T* static_shared(std::size_t count) {
  auto* base = reinterpret_cast<unsigned char*>(current_block->static_shared.data());
  std::size_t& used = shared_used();
  T* p = reinterpret_cast<T*>(base + used);
  used += (count * sizeof(T) + 15) / 16 * 16;
  return p;
}

inline void sync_block() {
  current_block->sync_block();
}

template <class T>
T shfl_xor(unsigned /*mask: all lanes take part in attnlab's kernels*/, T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(double));
  const unsigned t = threadIdx.x, warp = t / kWarp, lane = t % kWarp;
  // Two slots per lane, used by alternate shuffles: a lane writes slot k % 2 at its k-th shuffle
  // after passing the warp barrier of shuffle k − 1, which no lane reaches before it has read slot
  // k % 2 at shuffle k − 2. So one barrier per shuffle suffices.
  double* exchange = current_block->exchange.data() + (shuffles()++ % 2) * blockDim.x;
  std::memcpy(&exchange[t], &value, sizeof(T));
  current_block->sync_warp(warp);
  T other;
  std::memcpy(&other, &exchange[warp * kWarp + (lane ^ lane_mask)], sizeof(T));
  return other;
}

}  // namespace attnlab::emu

// The warp-collective matrix operations, 16-bit storage and cp.async.
#include "attnlab/backends/cuda_emulator_warp.hpp"

#define __syncthreads() ::attnlab::emu::sync_block()
#define __shfl_xor_sync(mask, value, lane_mask) ::attnlab::emu::shfl_xor(mask, value, lane_mask)
#define ATTNLAB_DYNAMIC_SHARED(name) unsigned char* name = ::attnlab::emu::dynamic_shared()
#define ATTNLAB_STATIC_SHARED(type, name, count) \
  type* name = ::attnlab::emu::static_shared<type>(count)
