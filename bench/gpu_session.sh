#!/usr/bin/env bash
# One device session: install the package (editable, with its FFI extensions), then (mode
# "tests") the GPU tests and compute-sanitizer memcheck on two decode steps (S = 4 and S = 1)
# and one prefill step, (mode "bench") the GPU benchmark table, (mode "step") the whole decode
# step against dense attention, (mode "floor") the latency floor of short attention calls
# (bench/latency_floor.py), or the profile / diagnose modes ("ab": other trees' kernels
# against this tree's, bench/ab_trees.py). Logs go to $OUT (the device tool's output folder)
# or ./gpu_logs.
set -u
MODE=${1:-tests}
OUT=${OUT:-$PWD/gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_MXFP4_CACHE_DIR=/tmp/jax_mxfp4_kernels
# Kernels compiled ahead on the CPU machine (bench/kernel_cache.py), when carried here.
[ -d bench/kernel_cache ] && export JAX_MXFP4_CACHE_DIR=$PWD/bench/kernel_cache
PY=python3
{
  nvidia-smi -L; $PY -c "import jax, triton; print('jax', jax.__version__, 'triton', triton.__version__, jax.devices())"
} > "$OUT/env.txt" 2>&1
# The device machine has no network: the build takes its tools from the image, and the
# package's dependencies (jax, numpy, ml_dtypes) are there already.
if ! $PY -c "import jax_mxfp4._ffi_gpu, jax_mxfp4._src.flydsl" 2>/dev/null; then
  $PY -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.txt" 2>&1 \
    || { echo "BUILD FAILED"; tail -30 "$OUT/build.txt"; exit 1; }
fi
$PY -m jax_mxfp4 info | tee "$OUT/info.txt"
if [ "$MODE" = tests ]; then
  timeout ${PYTEST_TIMEOUT:-450} $PY -m pytest -q -p no:cacheprovider tests/gpu tests/test_gpu_compile.py -ra ${PYTEST_ARGS:-} \
    > "$OUT/pytest.txt" 2>&1; echo "pytest rc=$?"; tail -25 "$OUT/pytest.txt"
  for step in decode decode1 prefill; do
    flag=""; [ $step = prefill ] && flag=--prefill; [ $step = decode1 ] && flag=--one-row
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 150 \
      compute-sanitizer --tool memcheck --print-limit 20 $PY tests/gpu/decode_step.py $flag \
      > "$OUT/memcheck_$step.txt" 2>&1; echo "memcheck $step rc=$?"; tail -4 "$OUT/memcheck_$step.txt"
  done
elif [ "$MODE" = profile ]; then
  # Nsight Compute's view of one launch of each main kernel at a decode and a prefill size.
  for cell in "index_scores_kernel|b32 S1 H1 ctx 128K" "index_scores_kernel|b1 q4096 ctx 8K" \
              "attention_kernel|256 rows x 16 pages" "select_blocks_kernel|4096 rows ctx 32K"; do
    kernel=${cell%%|*}; label=${cell#*|}
    timeout 150 ncu --clock-control none -k regex:"$kernel" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
      $PY bench/gpu_diagnose.py --plain "$label" > "$OUT/ncu_${kernel}_${label// /_}.txt" 2>&1
    echo "== ncu $kernel $label rc=$?"
    grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Stall|Shared Memory Configuration|Dynamic Shared|Static Shared|Issue Slots Busy|Executed Ipc|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Waves" \
      "$OUT/ncu_${kernel}_${label// /_}.txt" | head -40
  done
elif [ "$MODE" = diagnose ]; then
  timeout 200 $PY bench/gpu_diagnose.py > "$OUT/diagnose.txt" 2>&1; echo "diagnose rc=$?"
  cat "$OUT/diagnose.txt" | grep -v "^WARNING\|^I0000\|^W0000" | tail -80
  timeout 120 ncu --clock-control none -k regex:"kernel" --launch-skip 20 --launch-count 12 \
    --metrics gpu__time_duration.sum $PY bench/gpu_diagnose.py --plain "1 rows x 16 pages" \
    > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -E "kernel|gpu__time_duration|==PROF==|Error" "$OUT/ncu.txt" | head -40
  XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1 --xla_dump_to=$OUT/dump_cb" \
    timeout 120 $PY tests/gpu/decode_step.py --json > "$OUT/cb.txt" 2>&1; echo "cb rc=$?"; tail -3 "$OUT/cb.txt"
elif [ "$MODE" = ab ]; then
  # Other trees' kernels against this tree's, interleaved (bench/ab_trees.py: prepare the trees
  # here and carry bench/ab_trees to the device); TREES and CELLS comma-separated.
  timeout ${BENCH_TIMEOUT:-540} $PY bench/ab_trees.py run --trees "$TREES" --cells "$CELLS" \
    --rounds ${ROUNDS:-2} > "$OUT/ab.txt" 2> "$OUT/ab_err.txt"
  echo "ab rc=$?"; cat "$OUT/ab.txt"; tail -5 "$OUT/ab_err.txt"
elif [ "$MODE" = floor ]; then
  # The shortest a 1-32 row attention call could be: its dependent loads and launches alone.
  timeout 200 $PY bench/latency_floor.py --rows "${ROWS-1,8,32}" --index "${INDEX:-}" \
    > "$OUT/floor.txt" 2>&1
  echo "floor rc=$?"; grep -v "^WARNING\|^I0000\|^W0000" "$OUT/floor.txt" | tail -12
elif [ "$MODE" = step ]; then
  timeout ${BENCH_TIMEOUT:-540} $PY -m jax_mxfp4 bench --device gpu --step --repeats ${REPEATS:-5} \
    > "$OUT/step.txt" 2> "$OUT/step_err.txt"
  echo "step rc=$?"; cat "$OUT/step.txt"; tail -5 "$OUT/step_err.txt"
else
  timeout ${BENCH_TIMEOUT:-540} $PY -m jax_mxfp4 bench --device gpu --repeats ${REPEATS:-10} \
    --cells "${CELLS:-}" > "$OUT/bench.txt" 2> "$OUT/bench_err.txt"
  echo "bench rc=$?"; cat "$OUT/bench.txt"; tail -5 "$OUT/bench_err.txt"
fi
