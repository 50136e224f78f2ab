#!/bin/bash
# One device call (nvidia-h200) after an EP1 kernel change: this tree's EP1 GPU suite, one-GPU EP
# tests and sanitizers (ep1_checks.sh), the outputs of this tree and of the old one (out/ab_old:
# an exported commit with its built library, see ab_x2.sh) compared bit for bit
# (same_outputs.py), and the EP1 benchmark as new (with the torch peer), old, new in one run.
# Packed into $OUT/ab.tgz after every step.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; W=/tmp/ab; mkdir -p $OUT $W; ROOT=$PWD; OLD=$ROOT/${OLD:-out/ab_old}
TOKENS=${TOKENS:-1,16,64,256,1024,4096,8192}
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/ab.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
export PYTHONPATH=$ROOT
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
. benchmarks/device/ep1_checks.sh
grep -E "^(FAILED|ERROR)" $W/pytest.log $W/ep_local.log | head -20
timeout 90 python3 benchmarks/device/same_outputs.py save $W/out_new.pt > $W/same_new.log 2>&1; stamp "outputs (new) rc=$?"
(cd $OLD && PYTHONPATH=$OLD timeout 90 python3 $ROOT/benchmarks/device/same_outputs.py save $W/out_old.pt > $W/same_old.log 2>&1); stamp "outputs (old) rc=$?"
python3 benchmarks/device/same_outputs.py compare $W/out_old.pt $W/out_new.pt | tee $W/same.txt
timeout 170 python3 benchmarks/kernel_bench.py --reps 10 --tokens $TOKENS --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench (new) rc=$?"
grep -E "^(kernel|megamoe|unfused|copy|fp8|trace)" $W/bench.log | head -40
(cd $OLD && PYTHONPATH=$OLD timeout 120 python3 $OLD/benchmarks/kernel_bench.py --reps 10 --no-peer --tokens $TOKENS --out $W/kernel_bench_old.json > $W/bench_old.log 2>&1); stamp "bench (old) rc=$?"
grep -E "^(kernel|megamoe|copy)" $W/bench_old.log | head -20
timeout 120 python3 benchmarks/kernel_bench.py --reps 10 --no-peer --tokens $TOKENS --out $W/kernel_bench_new2.json > $W/bench_new2.log 2>&1; stamp "bench (new again) rc=$?"
grep -E "^(kernel|megamoe|copy)" $W/bench_new2.log | head -20
