#!/usr/bin/env bash
# The accelerator checks of one GPU machine, in one command that ends by itself (about 12 minutes on an
# H100/H200): the tests in tests/gpu, `python -m bench accelerator --device cuda`, the ranker's serving
# path on the GPU (`python -m bench serving --device cuda`: host CPU per request beyond the model, GPU
# busy) and the fleet on the GPU (`python -m bench run --profile gpu`). Run from the repository root with the
# machine's CUDA python:
#
#   tools/gpu_checks.sh OUTDIR
#
# Each step has its own time limit and the next one runs whatever the last one did. OUTDIR receives the
# machine's description, one log per step and results.tgz, which holds bench/results/gpu-accelerator,
# bench/results/gpu-serving and bench/results/gpu-fleet (unpack it at the repository root). A step's limit
# is an environment variable (SERVING_LIMIT_S, FLEET_LIMIT_S): set one to 1 to skip that step in effect.
set -uo pipefail
out=${1:?usage: tools/gpu_checks.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

pack() {
  tar czf "$out/results.tgz" bench/results/gpu-accelerator bench/results/gpu-serving bench/results/gpu-fleet 2>/dev/null
}
trap pack EXIT

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nproc
  "$py" -c 'import torch, grpc, google.protobuf as pb; print("torch", torch.__version__, "cuda", torch.version.cuda, "grpcio", grpc.__version__, "protobuf", pb.__version__)'
} >"$out/machine.txt" 2>&1

step() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$out/steps.txt"
}

step test-gpu 120 "$py" -m pytest -v -rs -p no:cacheprovider tests/gpu
step accelerator 110 "$py" -m bench accelerator --device cuda --repeats 30
step serving "${SERVING_LIMIT_S:-180}" "$py" -m bench serving --device cuda --model-preset gpu-dlrmv3 \
  --torch-threads 2 --lengths 1024,4096,8192 --pairs 80 --warmup-pairs 20 \
  --capacity-start 100 --capacity-seconds 4 --idle-pairs 20 --out bench/results/gpu-serving
step fleet "${FLEET_LIMIT_S:-360}" "$py" -m bench run --profile gpu --time-budget-s "${FLEET_BUDGET_S:-320}"
