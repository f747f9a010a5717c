// Preemption: SIGTERM (SLURM's --signal, a pod's deletion, dslaunch passing
// on its own) asks dsworker to stop. The handler only records the signal;
// the trainer agrees on it with every rank at the end of a step (the flag
// rides on the step's loss all-reduce, so every rank stops after the same
// step), saves a checkpoint of that step when a checkpoint directory is
// configured, and dsworker exits 128 + the signal. Further SIGTERMs change
// nothing: under SLURM the ranks get one from slurmstepd and one from their
// agent, and the save must not be cut short by the second.
//
// A rank that cannot end its step (blocked in a collective with a peer that
// hangs or is gone, or in the rendezvous) would otherwise wait for its
// agent's SIGKILL: a watchdog thread ends it with 128 + the signal when no
// step ended within max(2 s, 3 x the longest step so far) of the signal and
// the stop was not agreed yet. Once agreed, the save takes what it needs
// (the agent's SIGKILL after --kill_grace bounds it).
#pragma once

namespace dslaunch::worker {

// Installs the SIGTERM handler and starts the watchdog (process-wide; call
// once, from main's thread, before the first step).
void CatchStopSignal();
// The stop signal received so far, 0 for none.
int StopSignal();
// The training loop ended a step; and: the ranks agreed to stop (saving).
void NoteStepDone();
void NoteStopAgreed();

}  // namespace dslaunch::worker
