// ParallelRanges: a loop over a flat buffer's elements split across the
// OpenMP team, one contiguous range per thread (the optimizer step,
// worker/cpu_adam.cc, and the passes over whole buffers, worker/flat_math.h).
// Callable from any thread; each call opens its own OpenMP parallel region.
#pragma once

#include <omp.h>  // omp_get_thread_num, omp_get_num_threads

#include <algorithm>  // std::min
#include <cstddef>    // size_t

namespace dslaunch::worker {

// Ranges are whole blocks of 16 floats (one AVX-512 vector, one 64-byte
// line), so that no thread's range splits a vector.
inline constexpr size_t kParallelBlock = 16;
// Below this many elements one thread does the pass: an OpenMP region costs
// a few microseconds, about what 2 threads save on 32K floats.
inline constexpr size_t kMinParallel = size_t{1} << 15;

// Runs fn(begin, end) once per OpenMP thread on a contiguous run of [0, n)
// of whole `block`s (the last block may be partial; a thread left without
// one is not called), or once on the calling thread with [0, n) when
// n < min_parallel. The split depends on the thread count only in where it
// falls: a result is independent of the thread count when fn computes each
// element (or each fixed chunk) on its own.
template <typename Fn>
void ParallelRanges(size_t n, const Fn& fn, size_t block = kParallelBlock,
                    size_t min_parallel = kMinParallel) {
#pragma omp parallel if (n >= min_parallel)
  {
    const auto t = static_cast<size_t>(omp_get_thread_num());
    const auto threads = static_cast<size_t>(omp_get_num_threads());
    const size_t blocks = (n + block - 1) / block;
    const size_t first = blocks / threads * t + std::min(t, blocks % threads);
    const size_t count = blocks / threads + (t < blocks % threads ? 1 : 0);
    const size_t begin = std::min(n, first * block);
    const size_t end = std::min(n, (first + count) * block);
    if (begin < end) fn(begin, end);
  }
}

}  // namespace dslaunch::worker
