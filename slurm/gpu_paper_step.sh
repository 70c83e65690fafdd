#!/usr/bin/env bash
# The one-GPU check of the paper recipe (docs/memory.md): the 7B shape under ddp and under fsdp +
# activation checkpointing, and 13B under fsdp + checkpointing, each at grad-accum 8, 1,216
# tokens; the lean feature pass on the 7B shape. One JSON (and log) per run under $OUT (default
# runs/paper-step). About 5 minutes on one H200; each run is capped at 4 minutes.
#   bash slurm/gpu_paper_step.sh            # or: OUT=/some/dir bash slurm/gpu_paper_step.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs/paper-step}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
run() {
  local name=$1; shift
  timeout 240 "$py" -m repro bench paper-step "$@" --out "$out/$name.json" >"$out/$name.log" 2>&1
  echo "$name: exit $?"
}
run 7b-ddp --shape llama-2-7b --strategy ddp --steps 4 --grad-accum 8 --feature-examples 64 --feature-batch 16
run 7b-fsdp-ckpt --shape llama-2-7b --strategy fsdp --activation-checkpointing --steps 4 --grad-accum 8 --feature-examples 0
run 13b-fsdp-ckpt --shape llama-2-13b --strategy fsdp --activation-checkpointing --steps 4 --grad-accum 8 --feature-examples 0
for f in "$out"/*.json; do
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], {k: d.get(k) for k in ('step_s','tokens_per_s','mfu','peak_memory_mib','plan_mib','selection_share_of_2_epoch_training')})" "$f"
done
