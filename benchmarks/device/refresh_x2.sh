#!/bin/bash
# One x2 device call: refresh the EP2 benchmark, the plan-choice timings and the per-role
# profile for the current kernel. One archive.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ep_bench.py --reps 5 --out $OUT/kernel_ep2_bench.json > $OUT/ep_bench.log 2>&1; echo "ep_bench rc=$?"; grep "^|" $OUT/ep_bench.log
timeout 90 python3 benchmarks/device/plan_choices.py > $OUT/plan_choices.log 2>&1; echo "plan_choices rc=$?"; cat $OUT/plan_choices.log | tail -8
timeout 60 python3 benchmarks/device/profile_stages.py $OUT/profile_stages.json > $OUT/profile.log 2>&1; cat $OUT/profile.log
(cd $OUT && tar czf refresh.tgz --exclude refresh.tgz * && find . -maxdepth 1 -type f ! -name refresh.tgz -delete)
