#!/bin/bash
# Device side, one call: crossover CUPTI A/B of each prepared candidate against the committed
# build, then traces (3 calls each, the median kept) of the committed build and of the named
# candidates at $TRACE_TOKENS (default 1,3,12) tokens; everything in $OUT/candidates.tgz, the A/B lines on stdout.
# Usage (repo root, carry ["build/kernel", "out/var<NAME>", ...]):
#   bash benchmarks/device/candidates/run.sh "NAME:1,2,3,12,64,256,1024" "NAME"
# (a probe with a fault bit, as session 47's probe2 was, adds a case below with its FAULT values)
set -o pipefail
OUT=${OUT:-/tmp/out}; R=$PWD; W=/tmp/cand; mkdir -p $OUT $W
OLD=$(PYTHONPATH=$R python3 -c "from megamoe.kernel.build import library_path; print(library_path('sm_90a'))")  # the committed build
[ -f "$OLD" ] || { echo "run.sh: the committed build $OLD is missing: carry build/kernel" >&2; exit 2; }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for spec in $1; do
  name=${spec%%:*}; tokens=${spec#*:}
  echo "== A/B $name vs the committed build ($(basename $(dirname $OLD))) at $tokens tokens"
  (cd $R/out/var$name && PYTHONPATH=$PWD timeout 280 python3 benchmarks/device/ab_interleaved.py $OLD \
     $W/ab_$name.json $tokens 8 --kernel-time > $W/ab_$name.log 2>&1; grep "^T=" $W/ab_$name.log || tail -5 $W/ab_$name.log)
done
for name in base $2; do
  case $name in
    base) dir=$R; runs="0" ;;
    *) dir=$R/out/var$name; runs="0" ;;
  esac
  for f in $runs; do
    echo "== traces $name FAULT=$f"
    (cd $dir && mkdir -p $W/tr_${name}_$f && FAULT=$f OUT=$W/tr_${name}_$f PYTHONPATH=$PWD timeout 120 \
       python3 benchmarks/device/traces.py ${TRACE_TOKENS:-1,3,12} --max-tokens 8192 --calls 3 > $W/tr_${name}_$f/traces.log 2>&1;
     tail -2 $W/tr_${name}_$f/traces.log)
  done
done
tar czf $OUT/candidates.tgz -C /tmp cand
