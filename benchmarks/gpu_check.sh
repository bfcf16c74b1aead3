#!/usr/bin/env bash
# The one command to run on a GPU machine, within 8 minutes on one GPU: benchmarks/bench_gpu.py (our trainer step
# against TRL's on a Qwen2.5-0.5B-shaped model, rollout tokens/s, update MFU) and benchmarks/bench_gpu_pipeline.py
# (the ads pipeline's stages with device: auto: teacher SFT and RL, score-mode annotation of 100,000 pairs,
# distillation of a MiniLM-shaped student on them, scoring; rate and peak GPU memory per stage).
#
#   benchmarks/gpu_check.sh wheels   here, with a network: the wheels of the Python packages the GPU
#                                    machine's image lacks (or has at another version), at this venv's
#                                    versions, into .wheels/ (git-ignored, 16 MB; carry it to the machine)
#   benchmarks/gpu_check.sh          there: installs .wheels/*.whl into /tmp/site when present (else runs
#                                    with the image's packages, and bench_gpu.py records TRL as skipped
#                                    where it is missing), then runs bench_gpu.py (3 contenders of at
#                                    most 90 s each, the whole under 300 s) and bench_gpu_pipeline.py
#                                    (under 150 s)
#   benchmarks/gpu_check.sh --tiny   the same on CPU at a tiny size with this machine's packages
#                                    (tests/benchmarks/test_gpu_check.py)
#
# Results: $AGPO_BENCH_RESULTS, else $OUT (the device tool's output folder), else benchmarks/results/,
# as gpu_check.json and gpu_pipeline.json. Python: $PYTHON, else python3 (the GPU image's, which holds torch).
# The pipeline's stages import pyarrow, scikit-learn and matplotlib too: an image without them records the
# ImportError in gpu_pipeline.log and the trainer comparison still reports.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=(transformers trl datasets dill multiprocess math-verify latex2sympy2_extended antlr4-python3-runtime)

if [ "${1:-}" = wheels ]; then
    pins=$("$PYTHON" -c 'import sys, importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' "${WHEELS[@]}") || exit
    platforms=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
    # shellcheck disable=SC2086  # one argument per pin
    exec "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]/#/--platform=}" -d .wheels $pins
fi

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export AGPO_BENCH_RESULTS=${AGPO_BENCH_RESULTS:-${OUT:-}}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null ||
    echo "nvidia-smi: not available"
site=""
if [[ " $* " != *" --tiny "* ]] && compgen -G ".wheels/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .wheels/*.whl && site=/tmp/site
else
    echo "no .wheels/: running with this machine's packages"
fi
export PYTHONPATH="${site:+$site:}$PWD"
"$PYTHON" -c 'import importlib.metadata as m, torch
for n in ("torch", "transformers", "trl", "datasets"):
    try: print(n, m.version(n), end="; ")
    except m.PackageNotFoundError: print(n, "missing", end="; ")
print("cuda", torch.cuda.is_available())'
timeout 300 "$PYTHON" benchmarks/bench_gpu.py --part-timeout 90 "$@"
trainer=$?
tiny=()
[[ " $* " == *" --tiny "* ]] && tiny=(--tiny --pairs 300)
timeout 150 "$PYTHON" benchmarks/bench_gpu_pipeline.py "${tiny[@]}" 2>&1 | tee "${AGPO_BENCH_RESULTS:-/tmp}/gpu_pipeline.log"
pipeline=${PIPESTATUS[0]}
echo "bench_gpu.py exit $trainer, bench_gpu_pipeline.py exit $pipeline"
exit $((trainer || pipeline))
