#!/usr/bin/env bash
# Launch seq2seq_eval on this node with torchrun. Every argument is passed through.
#   NPROC         processes per node (default: visible GPUs, else 2)
#   MAX_RESTARTS  torchrun restarts of a failed worker group; restarted workers resume from
#                 the journal, so a rank killed mid-run costs at most its batch in flight (default 3)
#   LOG_RANKS     local ranks whose output is shown (default 0; "" shows all)
#   NNODES, NODE_RANK, RDZV_ENDPOINT, RDZV_ID   multi-node rendezvous (see README)
#   PYTHON        interpreter (default: python)
set -euo pipefail

PYTHON=${PYTHON:-python}
for arg in "$@"; do
  case "$arg" in
    -h|--help|--dry_run|--dry-run) exec "$PYTHON" -m seq2seq_eval "$@" ;;
  esac
done

if [ -z "${NPROC:-}" ]; then
  NPROC=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() or 2)')
fi
MAX_RESTARTS=${MAX_RESTARTS:-3}
LOG_RANKS=${LOG_RANKS-0}
NNODES=${NNODES:-1}

# Validate flags, data and model once, in one process, before any worker starts: a bad flag or
# a malformed file must fail once with one line, not be retried MAX_RESTARTS times on every rank.
# The dry run also prints the batch plan for this world size.
WORLD=$((NPROC * NNODES))
# RANK=0 with the launch's WORLD_SIZE: the plan is printed for that many ranks (a dry run never
# joins a process group). --dry_run goes last: the legacy form starts with its positional MODEL.
RANK=0 LOCAL_RANK=0 WORLD_SIZE=$WORLD LOCAL_WORLD_SIZE=$NPROC "$PYTHON" -m seq2seq_eval "$@" --dry_run

if [ "$NNODES" -gt 1 ]; then
  rdzv=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?set NODE_RANK for multi-node runs}"
        --rdzv_backend c10d --rdzv_endpoint "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port}"
        --rdzv_id "${RDZV_ID:-seq2seq_eval}")
else
  rdzv=(--standalone)
fi
filter=()
if [ -n "$LOG_RANKS" ]; then
  filter=(--local-ranks-filter "$LOG_RANKS")
fi

exec "$PYTHON" -m torch.distributed.run "${rdzv[@]}" --nproc_per_node "$NPROC" \
  --max_restarts "$MAX_RESTARTS" "${filter[@]}" -m seq2seq_eval "$@"
