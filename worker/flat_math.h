// Passes over whole flat fp32 buffers (a model's gradients or parameters, or
// a rank's owned pieces of them), parallel over OpenMP threads
// (ParallelRanges), for the optimizer's side of the engines (zero_state.cc,
// replicated_state.cc). Every result is independent of the thread count.
// Stateless; callable from any thread, each call opening its own OpenMP
// parallel region.
#pragma once

#include <cstddef>  // size_t
#include <span>

namespace dslaunch::worker {

// Sum of x[i]^2 in double (each square is exact there), taken in fixed
// chunks of 16K floats, each chunk in 16 lanes (lane j takes the elements at
// j mod 16) added in lane order, and the chunks' sums added in order. The
// bits depend on the values alone, not on the thread count or the ISA; zeros
// appended to x (a buffer's padding) leave them as they are.
double SquaredSum(std::span<const float> x);

// x[i] *= scale, then SquaredSum(x), in one pass; nothing is written when
// scale is 1.
double ScaleAndSquaredSum(std::span<float> x, float scale);

// dst[i] += src[i]; with `fresh`, dst[i] = 0.0f + src[i] instead: the bits
// a zeroed dst would get, without reading it.
// REQUIRES: same sizes; dst and src do not overlap.
void Accumulate(std::span<float> dst, std::span<const float> src, bool fresh);

// src to dst. REQUIRES: dst holds src.size() floats, not overlapping src.
void Copy(std::span<const float> src, float* dst);

}  // namespace dslaunch::worker
