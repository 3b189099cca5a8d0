// A CPU emulation of the CUDA thread model, just enough to run attnlab's kernels
// (lib/cuda/*_kernels.cuh) with the C++ compiler on a machine without a GPU:
//   - blockDim.x std::threads (one per CUDA thread) run the blocks of the grid one after another;
//   - __syncthreads is a std::barrier over the block, __shfl_xor_sync a lane exchange through a
//     buffer between two barriers of the warp's 32 threads;
//   - shared memory is one buffer per block, filled with 0xFF bytes (NaN for float and double) so
//     that a kernel reading shared memory it never wrote produces NaN.
// It checks the kernels' indexing, tiling, masking, synchronisation structure and arithmetic; not
// their speed, and not nvcc's code generation. 1-D blocks only (all of attnlab's kernels).
//
// Include this header before any kernel header, in a translation unit that includes no CUDA header.
#pragma once

#define ATTNLAB_CUDA_EMULATION 1

#include <barrier>
#include <cstddef>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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

// The state shared by the threads of one block.
struct Block {
  std::barrier<> barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<double> exchange;  // one 8-byte slot per thread for shuffles
  std::vector<double> dynamic_shared, static_shared;

  Block(unsigned threads, std::size_t dynamic_bytes)
      : barrier(threads),
        exchange(threads),
        dynamic_shared((dynamic_bytes + 7) / 8),
        static_shared(kStaticSharedBytes / 8) {
    for (unsigned w = 0; w < (threads + kWarp - 1) / kWarp; ++w) {
      warp_barriers.push_back(std::make_unique<std::barrier<>>(kWarp));
    }
    poison_shared();
  }

  // memset of an empty vector's data() (null) is undefined behaviour (UBSan, preset asan).
  void poison_shared() {
    if (!dynamic_shared.empty()) {
      std::memset(dynamic_shared.data(), 0xFF, dynamic_shared.size() * sizeof(double));
    }
    if (!static_shared.empty()) {
      std::memset(static_shared.data(), 0xFF, static_shared.size() * sizeof(double));
    }
  }
};

inline thread_local Block* current_block = nullptr;
inline thread_local std::size_t static_shared_used = 0;

inline unsigned char* dynamic_shared() {
  return reinterpret_cast<unsigned char*>(current_block->dynamic_shared.data());
}

// Each thread declares the kernel's static shared arrays in the same order, so each gets the same
// address for the same declaration.
template <class T>
T* static_shared(std::size_t count) {
  auto* base = reinterpret_cast<unsigned char*>(current_block->static_shared.data());
  T* p = reinterpret_cast<T*>(base + static_shared_used);
  static_shared_used += (count * sizeof(T) + 15) / 16 * 16;
  return p;
}

inline void sync_block() {
  current_block->barrier.arrive_and_wait();
}

template <class T>
T shfl_xor(unsigned /*mask: all lanes take part in attnlab's kernels*/, T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(double));
  const unsigned t = threadIdx.x, warp = t / kWarp, lane = t % kWarp;
  auto& bar = *current_block->warp_barriers[warp];
  std::memcpy(&current_block->exchange[t], &value, sizeof(T));
  bar.arrive_and_wait();
  T other;
  std::memcpy(&other, &current_block->exchange[warp * kWarp + (lane ^ lane_mask)], sizeof(T));
  bar.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
  return other;
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
          kernel(args...);
          // The next block starts with fresh (NaN-filled) shared memory.
          state.barrier.arrive_and_wait();
          if (t == 0) state.poison_shared();
          state.barrier.arrive_and_wait();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace attnlab::emu

#define __syncthreads() ::attnlab::emu::sync_block()
#define __shfl_xor_sync(mask, value, lane_mask) ::attnlab::emu::shfl_xor(mask, value, lane_mask)
#define ATTNLAB_DYNAMIC_SHARED(name) unsigned char* name = ::attnlab::emu::dynamic_shared()
#define ATTNLAB_STATIC_SHARED(type, name, count) \
  type* name = ::attnlab::emu::static_shared<type>(count)
