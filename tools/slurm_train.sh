#!/usr/bin/env bash
# Training on a slurm cluster: srun starts GPUS tasks, GPUS_PER_NODE per node, one GPU each; tools/train.py reads
# its rank from slurm (--launcher slurm). mmdet3d's arguments and variables:
#   [GPUS=16] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#       bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py options]
# WORK_DIR (checkpoints, logs, --auto-resume) and the data must be on a file system every node sees.
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
read -r -a EXTRA_SRUN_ARGS <<<"${SRUN_ARGS:-}"
PYTHON=${PYTHON:-python}
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
set -x
PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" srun -p "$PARTITION" --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 "${EXTRA_SRUN_ARGS[@]}" \
    "$PYTHON" -u "$REPO_ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
