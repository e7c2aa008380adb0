#!/usr/bin/env bash
# Testing on a slurm cluster: srun starts GPUS tasks, GPUS_PER_NODE per node, one GPU each; tools/test.py reads
# its rank from slurm (--launcher slurm). mmdet3d's arguments and variables:
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#       bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options, e.g. --eval bbox]
# The work dir (the collected results, --work-dir) and the data must be on a file system every node sees.
set -euo pipefail
if [ "$#" -lt 4 ]; then
    echo "usage: bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
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
    "$PYTHON" -u "$REPO_ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
