#!/usr/bin/env bash
# Runs one command as one process per GPU across the nodes of a SLURM allocation (multi-host jax.distributed).
#
# Needs: SLURM (sbatch/srun), GPU nodes with jaxlab and jax[cuda] installed in the active Python environment,
# the repository on a filesystem shared by all nodes. jaxlab.sharding.initialize_distributed() (called by the
# experiments CLI) reads SLURM_NTASKS / SLURM_PROCID / SLURM_STEP_NODELIST; the coordinator is the first
# node on port JAXLAB_COORDINATOR_PORT (set below). Each task sees one GPU (--gpus-per-task=1).
# Usage (submit):
#   sbatch --nodes=2 --gpus-per-node=8 tpu_gpu_scripts/launch_slurm.sh python -m experiments run lm_pretrain \
#       --preset full --set corpus.path=/shared/c4.jsonl --out /shared/runs/lm60m
# or inside an existing allocation (salloc):  bash tpu_gpu_scripts/launch_slurm.sh CMD [ARGS...]
# Options via environment: GPUS_PER_NODE (default: SLURM_GPUS_ON_NODE, else 8), JAXLAB_COORDINATOR_PORT.
#SBATCH --job-name=jaxlab
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "launch_slurm.sh: no command given (usage: sbatch [...] launch_slurm.sh CMD [ARGS...])" >&2
  exit 2
fi
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  echo "launch_slurm.sh: not inside a SLURM allocation (submit with sbatch or run under salloc)" >&2
  exit 2
fi
gpus_per_node=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
export JAXLAB_COORDINATOR_PORT=${JAXLAB_COORDINATOR_PORT:-$((SLURM_JOB_ID % 4096 + 61440))}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
echo "launch_slurm.sh: ${SLURM_JOB_NUM_NODES:-1} nodes x $gpus_per_node GPUs, coordinator port $JAXLAB_COORDINATOR_PORT"
exec srun --ntasks-per-node="$gpus_per_node" --gpus-per-task=1 --kill-on-bad-exit=1 "$@"
