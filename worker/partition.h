// How a flat buffer of n floats is split across the ranks of a ZeRO stage:
// padded up so every rank's shard has the same size (any world size works,
// not only ones dividing every tensor), each shard a multiple of 16 floats
// (64 bytes: whole cache lines and vector registers). Plain value; any thread.
#pragma once

#include <cstddef>

namespace dslaunch::worker {

struct Partition {
  size_t n = 0;      // real elements
  int world = 1;     // ranks
  size_t shard = 0;  // elements per rank, padding included
  size_t padded() const { return shard * static_cast<size_t>(world); }
  size_t begin(int rank) const { return shard * static_cast<size_t>(rank); }
  size_t end(int rank) const { return begin(rank) + shard; }
  // Real (unpadded) elements of `rank`'s shard.
  size_t real(int rank) const {
    const size_t b = begin(rank);
    return b >= n ? 0 : (n - b < shard ? n - b : shard);
  }
};

inline Partition MakePartition(size_t n, int world) {
  constexpr size_t kAlign = 16;
  Partition p;
  p.n = n;
  p.world = world < 1 ? 1 : world;
  const size_t per = (n + p.world - 1) / p.world;
  p.shard = (per + kAlign - 1) / kAlign * kAlign;
  return p;
}

}  // namespace dslaunch::worker
