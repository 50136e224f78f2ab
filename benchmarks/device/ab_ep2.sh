#!/bin/bash
# One x2 device call after a change to the EP path: this tree's one-GPU EP tests and EP2 job
# (cases, dead rank, pytest), then the EP2 benchmark of this tree and of other trees in turns
# (A, B, A: drift shows), then this tree's EP2 traces and host profile. Other trees are
# exported commits with their built library, carried under out/ (as for ab_x2.sh):
#   git archive <rev> csrc megamoe benchmarks/ep_bench.py benchmarks/kernel_bench.py pyproject.toml | tar x -C out/ab_old
#   + out/ab_old/build/kernel/<its hash>;  TREES="out/ab_old" (the default).
# Packed into $OUT/ab_ep2.tgz after every step.
export PYTHONUNBUFFERED=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/ab_ep2; mkdir -p $OUT $W; ROOT=$PWD; export PYTHONPATH=$ROOT
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/ab_ep2.tgz .); }
RUN2="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local > $W/ep_local.log 2>&1; stamp "EP local: $(tail -1 $W/ep_local.log)"
. benchmarks/device/ep2_checks.sh  # EP job (cases, dead rank) and its pytest
bench() {  # $1 tree root, $2 name
  (cd $1 && PYTHONPATH=$1 timeout 150 $RUN2 $1/benchmarks/ep_bench.py --reps 5 --out $W/kernel_ep2_bench_$2.json > $W/ep_bench_$2.log 2>&1)
  stamp "ep_bench ($2) rc=$?"; grep -E "^\| [0-9]+ \| megamoe" $W/ep_bench_$2.log
}
bench $ROOT new_a
for tree in ${TREES:-out/ab_old}; do [ -d $ROOT/$tree ] && bench $ROOT/$tree $(basename $tree); done
bench $ROOT new_b
OUT=$W timeout 100 $RUN2 benchmarks/device/traces_ep2.py > $W/traces_ep2.log 2>&1; stamp "EP2 traces rc=$?"; grep "^{'tokens" $W/traces_ep2.log
timeout 60 $RUN2 benchmarks/device/ep_host_profile.py $W/ep_host_profile.txt > $W/ep_host.log 2>&1; stamp "EP host profile rc=$?"
