#!/bin/bash
# One device call after a kernel change: the EP1 GPU suite and the one-GPU EP tests, then the
# EP1 benchmark of this tree (with the torch peer, copy bandwidth and FP8 GEMM rate) and of
# other trees side by side (A/B in one run), the per-role profile of each, and (on two GPUs)
# the EP2 job. Other trees are exported commits or variants with their built library, carried
# under out/ (see benchmarks/NOTES_kernel.md), e.g.
#   git archive <rev> csrc megamoe benchmarks/kernel_bench.py pyproject.toml | tar x -C out/ab_old
#   + out/ab_old/build/kernel/<its hash>;  TREES="out/ab_old out/ab_p" (default out/ab_old).
# A tree with a tests/ folder also runs the EP1 GPU suite. Packed into $OUT/ab.tgz after every step.
export PYTHONUNBUFFERED=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/ab; mkdir -p $OUT $W; ROOT=$PWD
TOKENS=${TOKENS:-1,16,64,256,1024,4096,8192}
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/ab.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
export PYTHONPATH=$ROOT
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $W/pytest.log 2>&1; stamp "EP1 suite: $(tail -1 $W/pytest.log)"
grep -E "^(FAILED|ERROR)|Error" $W/pytest.log | head -20
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local > $W/ep_local.log 2>&1; stamp "EP local: $(tail -1 $W/ep_local.log)"
timeout 170 python3 benchmarks/kernel_bench.py --reps 10 --tokens $TOKENS --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench (this tree) rc=$?"
grep -E "^(kernel|megamoe|unfused|copy|trace)" $W/bench.log | head -40
timeout 60 python3 benchmarks/device/profile_stages.py $W/profile_stages.json > $W/profile.log 2>&1; stamp "profile rc=$?"; tail -4 $W/profile.log
for tree in ${TREES:-out/ab_old}; do
  [ -d $ROOT/$tree ] || continue
  n=$(basename $tree); T=$ROOT/$tree
  if [ -d $T/tests ]; then
    (cd $T && PYTHONPATH=$T timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $W/pytest_$n.log 2>&1); stamp "EP1 suite ($n): $(tail -1 $W/pytest_$n.log)"
  fi
  (cd $T && PYTHONPATH=$T timeout 120 python3 $T/benchmarks/kernel_bench.py --reps 10 --no-peer --tokens $TOKENS --out $W/kernel_bench_$n.json > $W/bench_$n.log 2>&1); stamp "bench ($n) rc=$?"
  grep -E "^(kernel|megamoe|copy)" $W/bench_$n.log | head -20
  (cd $T && PYTHONPATH=$T timeout 60 python3 $ROOT/benchmarks/device/profile_stages.py $W/profile_stages_$n.json > $W/profile_$n.log 2>&1); stamp "profile ($n) rc=$?"; tail -4 $W/profile_$n.log
done
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ -z "$NO_EP2" ]; then
  . $ROOT/benchmarks/device/ep2_checks.sh  # EP job (cases, dead rank) and its pytest
fi
