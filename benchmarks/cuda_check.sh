#!/usr/bin/env bash
# The CUDA checks, for a lent GPU machine whose python3 has a CUDA build of torch (run from
# the repository root; wheels the machine lacks, built for its Python, may lie in .whl/):
# the CUDA tests of the engine, then `python -m benchmarks engine_cuda`. Each part has a
# time limit of its own; logs and the report go to $OUT (default /tmp/cuda-check).
set -u
OUT=${OUT:-/tmp/cuda-check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$OUT/gpu.txt"
engine=tests/unit/engine
# 1. the captured graphs and the CUDA engine tests that compile nothing
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -rs \
    "$engine/test_graphs.py" "$engine/test_cuda.py" -k "not inductor and not compiled_step" \
    2>&1 | tee "$OUT/tests.log"
# 2. the benchmark: eager vs captured graphs (eager and inductor steps) vs transformers
timeout "${BENCH_S:-270}" python3 -m benchmarks engine_cuda 2>&1 | tee "$OUT/bench.log"
cp benchmarks/reports/engine_cuda.json "$OUT/" 2>/dev/null
# 3. the tests that compile with inductor
timeout "${COMPILE_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -rs \
    "$engine/test_graphs.py" "$engine/test_cuda.py" -k "inductor or compiled_step" \
    2>&1 | tee "$OUT/tests_compiled.log"
