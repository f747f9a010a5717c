#!/usr/bin/env bash
# LUMI-style: an interactive allocation, then one dslaunch line that runs
# every rank inside the site's container image. From a login node:
#   salloc -N2 --ntasks-per-node=4 --gpus-per-node=4 --time=1:00:00 \
#          --account=project_465000000 --partition=standard-g
#   examples/hpc/lumi.sh train.py --deepspeed --deepspeed_config ds_config.json
# dslaunch finds the allocation itself (nodes, 4 ranks per node) and starts
# one agent per node as an srun step; each rank runs
#   singularity exec -B BINDS SIF python3 train.py ARGS --local_rank=N
# with the torchrun/DeepSpeed variables and srun's per-task SLURM_* (the
# LUMI example reads SLURM_NODEID). The compute nodes have no internet:
# Hugging Face reads its local cache only, and these variables reach every
# rank (HF_ and TRANSFORMERS_ are exported by default).
set -euo pipefail
SIF=${SIF:-/project/project_465000000/containers/pytorch.sif}            # EDIT
BINDS=${BINDS:-/scratch/project_465000000,/project/project_465000000}    # EDIT
CONTAINER=${CONTAINER:-singularity}   # or apptainer
export TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "${DSLAUNCH:-dslaunch}" "$CONTAINER" exec -B "$BINDS" "$SIF" python3 "$@"
