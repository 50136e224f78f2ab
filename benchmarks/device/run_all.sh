#!/bin/bash
# One device call: build (or reuse the carried build/), GPU test suite, benchmark.
# Usage (device, repo root): bash benchmarks/device/run_all.sh [quick|tests|bench|full]
set -o pipefail
MODE=${1:-full}
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>&1 | tee $OUT/gpu.txt
python3 -c "import megamoe.kernel.runtime as r; r.load_library(); import megamoe.kernel as k; print(k.build(verbose=True).path)" 2>&1 | tee $OUT/build.log || exit 1
case $MODE in
  final2)
    # end of a session: GPU suite, sanitizers, traces + calibration (issue 7), plan choices,
    # the side-by-side EP1 benchmark, the per-role profile; everything in one archive
    timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $OUT/pytest.log 2>&1; tail -3 $OUT/pytest.log
    for tool in memcheck racecheck synccheck; do
      timeout 90 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/device/sanitize_small.py > $OUT/sanitizer_$tool.log 2>&1
      echo "compute-sanitizer $tool rc=$?: $(grep -E "SUMMARY|sanitize_small" $OUT/sanitizer_$tool.log | tr '\n' ' ')"
    done
    PYTHONPATH=. timeout 120 python3 benchmarks/device/traces.py > $OUT/traces.log 2>&1; tail -3 $OUT/traces.log
    PYTHONPATH=. timeout 90 python3 benchmarks/device/plan_choices.py > $OUT/plan_choices.log 2>&1; tail -8 $OUT/plan_choices.log
    timeout 150 python3 benchmarks/kernel_bench.py --reps 10 --out $OUT/kernel_bench.json > $OUT/bench.log 2>&1; tail -16 $OUT/bench.log
    timeout 60 python3 benchmarks/device/profile_stages.py $OUT/profile_stages.json > $OUT/profile.log 2>&1; cat $OUT/profile.log
    (cd $OUT && tar czf final.tgz --exclude final.tgz * && find . -maxdepth 1 -type f ! -name final.tgz -delete) ;;
  profile)
    timeout 200 python3 benchmarks/device/profile_stages.py $OUT/profile_stages.json 2>&1 | tee $OUT/profile.log ;;
  probe)
    # timing variants of the current kernel + the FP8 accumulator probe
    timeout 60 python3 benchmarks/device/fp8_acc_probe.py $OUT/fp8_acc_probe.npz 2>&1 | tail -3
    timeout 200 python3 benchmarks/device/variants.py $OUT/kernel_variants.json 2>&1 | tee $OUT/variants.log ;;
  debug)
    timeout 45 python3 benchmarks/device/debug_kernel.py 2>&1 | tee $OUT/debug.log ;;
  all)
    timeout 45 python3 benchmarks/device/debug_kernel.py > $OUT/debug.log 2>&1; tail -3 $OUT/debug.log
    grep -q "ALL OK" $OUT/debug.log || { grep -v "^cta" $OUT/debug.log | tail -20; exit 3; }
    timeout 100 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_gpu.py -k "tiny or zero or all_masked or trace or timeout or deterministic or test_v4_flash and (1000 or 128)" 2>&1 | tee $OUT/pytest.log | tail -15
    timeout 170 python3 benchmarks/kernel_bench.py --reps 10 --out $OUT/kernel_bench.json 2>&1 | tee $OUT/bench.log ;;
  variants)
    timeout 100 python3 benchmarks/device/variants.py $OUT/kernel_variants.json 2>&1 | tee $OUT/variants.log ;;
  final)
    timeout 60 python3 -m pytest -x -q -p no:cacheprovider --timeout 30 tests/test_kernel_gpu.py -k "tiny or zero or all_masked or trace or timeout or deterministic or plan or test_v4_flash and (1000 or 128)" 2>&1 | tee $OUT/pytest.log | tail -4
    grep -q " passed" $OUT/pytest.log && ! grep -q "failed\|error" $OUT/pytest.log || exit 4
    timeout 60 python3 benchmarks/kernel_bench.py --reps 5 --no-peer --out $OUT/kernel_bench_v2.json 2>&1 | tee $OUT/bench.log ;;
  quick)
    timeout 200 python3 -m pytest -x -q -p no:cacheprovider --timeout 90 tests/test_kernel_gpu.py -k "tiny or zero or all_masked or trace or test_v4_flash and 128" 2>&1 | tee $OUT/pytest.log
    timeout 200 python3 benchmarks/kernel_bench.py --tokens 1,256,4096 --reps 5 --no-peer --out $OUT/kernel_bench_quick.json 2>&1 | tee $OUT/bench.log ;;
  tests)
    timeout 400 python3 -m pytest -q -p no:cacheprovider --timeout 90 tests/test_kernel_gpu.py 2>&1 | tee $OUT/pytest.log ;;
  bench)
    timeout 500 python3 benchmarks/kernel_bench.py --out $OUT/kernel_bench.json 2>&1 | tee $OUT/bench.log ;;
  full)
    timeout 280 python3 -m pytest -q -p no:cacheprovider --timeout 90 tests/test_kernel_gpu.py 2>&1 | tee $OUT/pytest.log
    timeout 300 python3 benchmarks/kernel_bench.py --out $OUT/kernel_bench.json 2>&1 | tee $OUT/bench.log ;;
esac
