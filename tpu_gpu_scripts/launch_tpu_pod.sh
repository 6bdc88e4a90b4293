#!/usr/bin/env bash
# Runs one command on every worker of a Cloud TPU VM pod slice (multi-host jax.distributed).
#
# Needs: the gcloud CLI, authenticated, with access to the TPU VM; the repository checked out at the same
# path on every worker (or pass -s to copy this checkout there first); jaxlab installed on the workers
# (pip install -e . plus jax[tpu]). jax.distributed needs no addresses on Cloud TPU: the experiments CLI
# calls jaxlab.sharding.initialize_distributed(), which detects the TPU environment on each worker.
# Usage:
#   tpu_gpu_scripts/launch_tpu_pod.sh -t TPU_NAME -z ZONE [-p PROJECT] [-r REMOTE_DIR] [-s] -- CMD [ARGS...]
#   tpu_gpu_scripts/launch_tpu_pod.sh -t my-v4-32 -z us-central2-b -s -- \
#       python -m experiments run lm_pretrain --preset full --set corpus.path=/data/c4.jsonl --out gs://bucket/run
# -s copies this checkout (git-tracked files) to REMOTE_DIR (default ~/jaxlab) on all workers and runs
# `pip install -e .` there. Output of every worker is streamed back, prefixed by gcloud with the worker id.
# Use a gs:// --out (or a shared filesystem) so checkpoints from all hosts land in one place.
set -euo pipefail

tpu="" zone="" project="" remote_dir="~/jaxlab" sync=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) tpu="$2"; shift 2 ;;
    -z) zone="$2"; shift 2 ;;
    -p) project="$2"; shift 2 ;;
    -r) remote_dir="$2"; shift 2 ;;
    -s) sync=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "launch_tpu_pod.sh: unknown option $1 (see -h)" >&2; exit 2 ;;
  esac
done
if [[ -z "$tpu" || -z "$zone" || $# -eq 0 ]]; then
  echo "launch_tpu_pod.sh: need -t TPU_NAME, -z ZONE and a command after -- (see -h)" >&2
  exit 2
fi
command -v gcloud >/dev/null || { echo "launch_tpu_pod.sh: gcloud not found on PATH" >&2; exit 2; }

gc=(gcloud compute tpus tpu-vm)
where=(--zone "$zone")
[[ -n "$project" ]] && where+=(--project "$project")

if (( sync )); then
  repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
  archive=$(mktemp "${TMPDIR:-/tmp}/jaxlab-XXXXXX.tar.gz")
  git -C "$repo" ls-files -z | tar -C "$repo" --null -T - -czf "$archive"
  "${gc[@]}" scp "$archive" "$tpu:/tmp/jaxlab.tar.gz" --worker=all "${where[@]}"
  "${gc[@]}" ssh "$tpu" --worker=all "${where[@]}" --command \
    "mkdir -p $remote_dir && tar -xzf /tmp/jaxlab.tar.gz -C $remote_dir && cd $remote_dir && pip install -q -e ."
  rm -f "$archive"
fi

cmd=$(printf '%q ' "$@")
"${gc[@]}" ssh "$tpu" --worker=all "${where[@]}" --command "cd $remote_dir && $cmd"
