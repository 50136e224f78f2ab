#!/bin/bash
# One single-GPU device call (nvidia-h200) at the end of a session, when the two-GPU machine
# is not lent (it runs on the x2 machine too, on GPU 0): the EP1 GPU suite and the one-GPU EP
# tests, compute-sanitizer (memcheck / racecheck / synccheck) on a small launch, EP1 traces at
# every benchmark size and the per-role profile (what the model is fitted to, first), the EP1
# benchmark with its peers, plan-choice timings, the trace overhead and the timing variants.
# Packed into $OUT/final.tgz after every step (a run cut short still returns what it
# finished). The EP2 parts are in ep2_x2.sh / ab_ep2.sh (or verify_x2.sh / session_x2.sh /
# refresh_x2.sh). With FlagGems wheels carried (.whl) run it as: python3 -m pip install -q --no-index
# --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site bash $0
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # (keeps /tmp/site: FlagGems wheels, see the header)
OUT=${OUT:-/tmp/out}; W=/tmp/final; mkdir -p $OUT $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/final.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
. benchmarks/device/ep1_checks.sh  # EP1 suite, one-GPU EP tests, three sanitizers
OUT=$W timeout 120 python3 benchmarks/device/traces.py > $W/traces.log 2>&1; stamp "EP1 traces rc=$?"
timeout 60 python3 benchmarks/device/profile_stages.py $W/profile_stages.json > $W/profile.log 2>&1; stamp "profile rc=$?"
timeout 300 python3 benchmarks/kernel_bench.py --reps 10 --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench rc=$?"; grep -E "^(megamoe|unfused|flaggems|copy|fp8|trace)" $W/bench.log
OUT=$W timeout 80 python3 benchmarks/device/plan_choices.py > $W/plan_choices.log 2>&1; stamp "plan choices rc=$?"
timeout 90 python3 benchmarks/device/trace_overhead.py $W/trace_overhead.json > $W/trace_overhead.log 2>&1; stamp "trace overhead rc=$?"; cat $W/trace_overhead.log
timeout 60 python3 benchmarks/device/variants.py $W/variants.json 64,4096 > $W/variants.log 2>&1; stamp "variants rc=$?"; cat $W/variants.log
