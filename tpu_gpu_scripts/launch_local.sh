#!/usr/bin/env bash
# Runs one command as N cooperating local JAX processes on this machine's CPU (jax.distributed + gloo).
#
# Needs: bash >= 5.1, python with jaxlab installed; a free TCP port on 127.0.0.1 (picked automatically).
# Usage:
#   tpu_gpu_scripts/launch_local.sh [-n NPROC] [-d DEVICES_PER_PROCESS] [-p PORT] [-l LOG_DIR] -- CMD [ARGS...]
#   tpu_gpu_scripts/launch_local.sh -n 2 -- python -m experiments run lm_pretrain --preset smoke
# Each process gets JAXLAB_COORDINATOR=127.0.0.1:PORT, JAXLAB_NUM_PROCESSES=N and JAXLAB_PROCESS_ID=i,
# which jaxlab.sharding.initialize_distributed() reads (the experiments CLI calls it first), plus
# JAX_PLATFORMS=cpu and XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES_PER_PROCESS (default 1).
# Process 0's output goes to this terminal; every process also logs to LOG_DIR/proc<i>.log. If any process
# fails, the others are stopped and the script exits with the first failing exit code.
set -euo pipefail

nproc=2
devices=1
port=""
log_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nproc="$2"; shift 2 ;;
    -d) devices="$2"; shift 2 ;;
    -p) port="$2"; shift 2 ;;
    -l) log_dir="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "launch_local.sh: no command given (usage: launch_local.sh -n 2 -- python -m experiments ...)" >&2
  exit 2
fi
if ! [[ "$nproc" =~ ^[0-9]+$ ]] || (( nproc < 1 )); then
  echo "launch_local.sh: -n expects a positive integer, found '$nproc'" >&2
  exit 2
fi
if [[ -z "$port" ]]; then
  port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
fi
log_dir=${log_dir:-$(mktemp -d "${TMPDIR:-/tmp}/jaxlab-local-XXXXXX")}
mkdir -p "$log_dir"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup INT TERM

for ((i = 0; i < nproc; i++)); do
  log="$log_dir/proc$i.log"
  (
    export JAXLAB_COORDINATOR="127.0.0.1:$port" JAXLAB_NUM_PROCESSES="$nproc" JAXLAB_PROCESS_ID="$i"
    export JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$devices ${XLA_FLAGS_EXTRA:-}"
    if (( i == 0 )); then
      exec "$@" > >(tee "$log") 2>&1
    else
      exec "$@" > "$log" 2>&1
    fi
  ) &
  pids+=($!)
done

status=0
declare -A live=()
for ((i = 0; i < nproc; i++)); do live[${pids[$i]}]=$i; done
while (( ${#live[@]} > 0 )); do
  set +e
  wait -n -p finished "${!live[@]}"
  rc=$?
  set -e
  [[ -n "${finished:-}" && -n "${live[$finished]:-}" ]] || break
  i=${live[$finished]}
  unset "live[$finished]"
  if (( rc != 0 && status == 0 )); then
    status=$rc
    echo "launch_local.sh: process $i exited with $rc; stopping the others (log: $log_dir/proc$i.log)" >&2
    tail -n 20 "$log_dir/proc$i.log" >&2 || true
    for pid in "${!live[@]}"; do kill "$pid" 2>/dev/null || true; done
  fi
done
echo "launch_local.sh: $nproc processes finished (exit $status); logs in $log_dir" >&2
exit "$status"
