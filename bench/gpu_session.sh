#!/usr/bin/env bash
# One device session: build the package's FFI extensions, then (mode "tests") the GPU tests and
# compute-sanitizer memcheck on one decode and one prefill step, or (mode "bench") the GPU
# benchmark table. Logs go to $OUT (the device tool's output folder) or ./gpu_logs.
set -u
MODE=${1:-tests}
OUT=${OUT:-$PWD/gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_MXFP4_CACHE_DIR=/tmp/jax_mxfp4_kernels
PY=python3
{
  nvidia-smi -L; $PY -c "import jax, triton; print('jax', jax.__version__, 'triton', triton.__version__, jax.devices())"
} > "$OUT/env.txt" 2>&1
BUILD=/tmp/jax_mxfp4_build
if [ ! -f jax_mxfp4/_ffi_gpu*.so ]; then
  (cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v $PY)" \
     && cmake --build $BUILD -j 16 && cp $BUILD/ffi/_ffi_*.so jax_mxfp4/) > "$OUT/build.txt" 2>&1 \
     || { echo "BUILD FAILED"; tail -30 "$OUT/build.txt"; exit 1; }
fi
export PYTHONPATH=$PWD
$PY -m jax_mxfp4 info | tee "$OUT/info.txt"
if [ "$MODE" = tests ]; then
  timeout 330 $PY -m pytest -q -p no:cacheprovider tests/gpu tests/test_gpu_compile.py -ra \
    > "$OUT/pytest.txt" 2>&1; echo "pytest rc=$?"; tail -25 "$OUT/pytest.txt"
  for step in decode prefill; do
    flag=""; [ $step = prefill ] && flag=--prefill
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 150 \
      compute-sanitizer --tool memcheck --print-limit 20 $PY tests/gpu/decode_step.py $flag \
      > "$OUT/memcheck_$step.txt" 2>&1; echo "memcheck $step rc=$?"; tail -4 "$OUT/memcheck_$step.txt"
  done
else
  timeout ${BENCH_TIMEOUT:-540} $PY -m jax_mxfp4 bench --device gpu --repeats ${REPEATS:-10} > "$OUT/bench.txt" 2> "$OUT/bench_err.txt"
  echo "bench rc=$?"; cat "$OUT/bench.txt"; tail -5 "$OUT/bench_err.txt"
fi
