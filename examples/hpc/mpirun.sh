#!/usr/bin/env bash
# mpirun-style: a script written for `mpirun -np 8 python3 train.py` (it
# calls MPI_Init through mpi4py and takes its rank and size from
# MPI_COMM_WORLD) runs under dslaunch's supervision: OpenMPI's mpirun starts
# the job, MPI_COMM_WORLD equals dslaunch's world (MPI rank = RANK), and
# output, fail-fast, the report and the exit status are dslaunch's.
#   inside an allocation:  salloc -N2 --ntasks-per-node=4
#                          examples/hpc/mpirun.sh train.py --epochs 3
#   over a hostfile:       HOSTFILE=hosts.txt examples/hpc/mpirun.sh train.py
#   mpirun's own options:  MPIRUN_ARGS="--mca btl tcp,self" examples/hpc/mpirun.sh ...
set -euo pipefail
args=(--launcher openmpi)
if [ -n "${HOSTFILE:-}" ]; then args+=(--hostfile "$HOSTFILE"); fi
if [ -n "${MPIRUN_ARGS:-}" ]; then args+=(--launcher_args "$MPIRUN_ARGS"); fi
exec "${DSLAUNCH:-dslaunch}" "${args[@]}" "$@"
