// How the ranks of a GPU run exchange gradients and parameters: NCCL among
// their GPUs where every rank has a GPU of its own (compared by UUID) and
// NCCL loads on every rank, else Gloo through host memory. DSL_NCCL=0
// keeps Gloo; DSL_NCCL=1 takes NCCL even for one rank (its collectives are
// then copies), which is how a machine with one GPU tests that path. The
// ranks take every decision together, by votes over the Gloo Comm, so they
// never part ways. Called once by a GPU engine at its start, on the
// training thread.
#pragma once

#include <string>

#include "base/status.h"
#include "worker/comm.h"
#include "worker/device_engine.h"

namespace dslaunch::worker::gpu {

struct Collectives {
  bool nccl = false;     // the device's collectives are joined
  std::string describe;  // "NCCL", or "Gloo through host memory (why)"
};

// Collective on comm: every rank calls it with its own device. Joins the
// device's NCCL communicator when every rank can; an error only from the
// Gloo votes themselves.
StatusOr<Collectives> ChooseCollectives(Comm& comm, DeviceEngine& dev);

// DSL_NCCL=1.
bool NcclForced();

}  // namespace dslaunch::worker::gpu
