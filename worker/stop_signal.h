// Preemption: SIGTERM (SLURM's --signal, a pod's deletion, dslaunch passing
// on its own) asks dsworker to stop. The handler only records the signal;
// the trainer agrees on it with every rank at the end of a step (the flag
// rides on the step's loss all-reduce, so every rank stops after the same
// step), saves a checkpoint of that step when a checkpoint directory is
// configured, and dsworker exits 128 + the signal. Further SIGTERMs change
// nothing: under SLURM the ranks get one from slurmstepd and one from their
// agent, and the save must not be cut short by the second (the agent's
// SIGKILL after --kill_grace bounds the wait).
#pragma once

namespace dslaunch::worker {

// Installs the SIGTERM handler (process-wide; call once, from main).
void CatchStopSignal();
// The stop signal received so far, 0 for none.
int StopSignal();
// For tests: as if `sig` had arrived (0 clears).
void SetStopSignalForTest(int sig);

}  // namespace dslaunch::worker
