#!/usr/bin/env bash
# Distributed training: one process per GPU (nccl), or per CPU process (gloo) without GPUs.
#   bash tools/dist_train.sh CONFIG NUM_PROCESSES [tools/train.py options]
set -euo pipefail
if [ "$#" -lt 2 ]; then
    echo "usage: bash tools/dist_train.sh CONFIG NUM_PROCESSES [train.py options]" >&2
    exit 2
fi
CONFIG=$1
NPROC=$2
shift 2
PYTHON=${PYTHON:-python}
TOOLS_DIR=$(dirname "$0")
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --nproc_per_node="$NPROC" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    "$TOOLS_DIR/train.py" "$CONFIG" --launcher pytorch "$@"
