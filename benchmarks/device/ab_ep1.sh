#!/bin/bash
# One device call (nvidia-h200) after an EP1 kernel change: this tree's EP1 GPU suite, one-GPU EP
# tests and sanitizers (ep1_checks.sh), the outputs of this tree and of the old one (out/ab_old:
# an exported commit with its built library, see ab_x2.sh) compared bit for bit
# (same_outputs.py), and the EP1 benchmark as new (with the torch peer), old, new in one run.
# OLD may name several trees (space-separated, e.g. variants of one change): each is compared
# and benchmarked in turn, between the two runs of this tree. Packed into $OUT/ab.tgz after
# every step.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; W=/tmp/ab; mkdir -p $OUT $W; ROOT=$PWD; OLDS=${OLD:-out/ab_old}
TOKENS=${TOKENS:-1,16,64,256,1024,4096,8192}
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/ab.tgz --exclude "*.pt" .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
export PYTHONPATH=$ROOT
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
. benchmarks/device/ep1_checks.sh
grep -E "^(FAILED|ERROR)" $W/pytest.log $W/ep_local.log | head -20
timeout 90 python3 benchmarks/device/same_outputs.py save $W/out_new.pt > $W/same_new.log 2>&1; stamp "outputs (new) rc=$?"
for o in $OLDS; do
  OLD=$ROOT/$o; n=$(basename $o)
  (cd $OLD && PYTHONPATH=$OLD timeout 90 python3 $ROOT/benchmarks/device/same_outputs.py save $W/out_$n.pt > $W/same_$n.log 2>&1); stamp "outputs ($n) rc=$?"
  python3 benchmarks/device/same_outputs.py compare $W/out_$n.pt $W/out_new.pt | tee $W/same_$n.txt
done
timeout 170 python3 benchmarks/kernel_bench.py --reps 10 --tokens $TOKENS --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench (new) rc=$?"
grep -E "^(kernel|megamoe|unfused|copy|fp8|trace)" $W/bench.log | head -40
for o in $OLDS; do
  OLD=$ROOT/$o; n=$(basename $o)
  (cd $OLD && PYTHONPATH=$OLD timeout 120 python3 $OLD/benchmarks/kernel_bench.py --reps 10 --no-peer --tokens $TOKENS --out $W/kernel_bench_$n.json > $W/bench_$n.log 2>&1); stamp "bench ($n) rc=$?"
  grep -E "^(kernel|megamoe|copy)" $W/bench_$n.log | head -20
done
timeout 120 python3 benchmarks/kernel_bench.py --reps 10 --no-peer --tokens $TOKENS --out $W/kernel_bench_new2.json > $W/bench_new2.log 2>&1; stamp "bench (new again) rc=$?"
grep -E "^(kernel|megamoe|copy)" $W/bench_new2.log | head -20
