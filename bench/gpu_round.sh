#!/usr/bin/env bash
# One GPU round of measurements on the embedded SmolLM2-135M (bench/gpu_round.py): generation
# tokens/s with HF and with vLLM and their ratio, one GRPO step, one full coevolve round.
# On a machine with the package index and the model cache:   bash bench/gpu_round.sh run
# On a GPU machine without either (the device tool), after bench/gpu_pack.sh here:
#   bash bench/gpu_round.sh stage .gpu/part-1    (one call per part, each carrying that part)
#   bash bench/gpu_round.sh run                  (joins the model, installs the wheels, measures)
set -euo pipefail
CACHE=${EVOTRAINER_GPU_CACHE:-/root/evotrainer-gpu-cache}   # outlives calls on a warm machine
PY=${PY:-python3}
case "${1:-run}" in
  stage)
    mkdir -p "$CACHE"; cp -r "$2"/. "$CACHE"/; ls -la "$CACHE"; exit 0 ;;
  run) ;;
  *) echo "usage: $0 stage DIR | run" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false EVOTRAINER_HOME=${EVOTRAINER_HOME:-$CACHE/home}
if [ -d "$CACHE/wheels" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$CACHE/site" "$CACHE"/wheels/*.whl
  export PYTHONPATH="$PWD:$CACHE/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f "$CACHE/model.gguf.name" ]; then   # a carried GGUF: join, check, convert once
  name=$(cat "$CACHE/model.gguf.name")
  if [ ! -f "$CACHE/gguf/$name" ]; then
    mkdir -p "$CACHE/gguf"; cat "$CACHE"/model.gguf.? > "$CACHE/gguf/$name"
  fi
  echo "$(cat "$CACHE/model.gguf.sha256")  $CACHE/gguf/$name" | sha256sum -c -
  export EVOTRAINER_GGUF="$CACHE/gguf/$name"
fi
nvidia-smi -L || true
timeout 470 $PY bench/gpu_round.py --out "${OUT:-bench-out}"
