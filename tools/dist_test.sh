#!/usr/bin/env bash
# Distributed testing: one process per GPU (nccl), or per CPU process (gloo) without GPUs.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCESSES [tools/test.py options, e.g. --eval bbox]
set -euo pipefail
if [ "$#" -lt 3 ]; then
    echo "usage: bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCESSES [test.py options]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
shift 3
PYTHON=${PYTHON:-python}
TOOLS_DIR=$(dirname "$0")
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --nproc_per_node="$NPROC" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    "$TOOLS_DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
