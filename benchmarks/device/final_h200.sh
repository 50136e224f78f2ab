#!/bin/bash
# The single-GPU device run at the end of a session (nvidia-h200; on the x2 machine it uses GPU 0),
# in three parts, each meant for one device call (600 s): in session 48 `suite` took 357 s and
# `check` 139 s; their steps' timeouts add up to more (check 1100 s, bench 670 s), so a part that
# hangs is cut by the call's limit, and what it finished is in its archive:
#   suite  the EP1 GPU suite, the one-GPU EP tests and the numerics against both references
#   check  with OLD_LIB=path/to/an earlier libmegamoe_sm90.so the crossover CUPTI A/B of this
#          build against it (AB_TOKENS, default 1,2,3,12,64,1024; 8 rounds), then compute-sanitizer
#          on the small launches (sanitize.sh)
#   bench  EP1 traces at every count the model is fitted to (the median of five calls each), the
#          benchmark with its peers, the trace overhead, plan-choice timings, the per-role profile
#          (not run yet as a part; the timing variants, variants.py, are run on their own)
# (several parts: `bash final_h200.sh suite check`; none: all three, for a machine without the
# per-call limit). Each part packs its folder /tmp/final/<part> into $OUT/final_<part>.tgz after
# every step, so a run cut short still returns what it finished.
# The EP2 parts are in ep2_x2.sh / ab_ep2.sh (or verify_x2.sh / session_x2.sh / refresh_x2.sh).
# FlagGems (the benchmark's peer) and the packages the device image lacks travel as wheels (.whl,
# carried): python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
# --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site bash $0 PART
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # (keeps /tmp/site, see the header)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
PARTS=${*:-suite check bench}
for PART in $PARTS; do
  case $PART in suite|check|bench) ;; *) echo "final_h200.sh: PART: expected suite, check or bench, got $PART" >&2; exit 2 ;; esac
done
for PART in $PARTS; do
W=/tmp/final/$PART; mkdir -p $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/final_$PART.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "$PART: build: $(tail -1 $W/build.log)"
case $PART in
  suite)
    . benchmarks/device/ep1_suite.sh
    timeout 150 python3 benchmarks/device/numerics_h200.py $W/kernel_numerics_h200.json > $W/numerics.log 2>&1; stamp "numerics rc=$?"; tail -14 $W/numerics.log ;;
  check)
    if [ -n "$OLD_LIB" ]; then
      timeout 200 python3 benchmarks/device/ab_interleaved.py $OLD_LIB $W/ab_landed.json ${AB_TOKENS:-1,2,3,12,64,1024} 8 --kernel-time > $W/ab_landed.log 2>&1
      stamp "A/B against $OLD_LIB rc=$?"; grep "^T=" $W/ab_landed.log
    fi
    . benchmarks/device/sanitize.sh ;;
  bench)
    OUT=$W timeout 150 python3 benchmarks/device/traces.py 1,3,6,8,12,16,64,256,512,1024,4096,8192 > $W/traces.log 2>&1; stamp "EP1 traces rc=$?"
    OUT=$W timeout 40 python3 benchmarks/device/traces.py 64,512 --ctas-per-sm 1 --max-tokens 8192 > $W/traces_one_cta.log 2>&1; stamp "one-CTA traces rc=$?"
    timeout 250 python3 benchmarks/kernel_bench.py --reps 10 --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench rc=$?"; grep -E "^(megamoe|unfused|flaggems|copy|fp8|trace)" $W/bench.log
    timeout 90 python3 benchmarks/device/trace_overhead.py $W/trace_overhead.json > $W/trace_overhead.log 2>&1; stamp "trace overhead rc=$?"; tail -4 $W/trace_overhead.log
    OUT=$W timeout 80 python3 benchmarks/device/plan_choices.py > $W/plan_choices.log 2>&1; stamp "plan choices rc=$?"
    timeout 60 python3 benchmarks/device/profile_stages.py $W/profile_stages.json > $W/profile.log 2>&1; stamp "profile rc=$?" ;;
esac
done
