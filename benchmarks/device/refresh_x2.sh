#!/bin/bash
# One x2 device call (part 2 of 2 after session_x2.sh): the EP2 benchmark (with where the
# call's time goes: host, staged inputs, back to back), the EP1 benchmark with its peer, the
# per-role profile. Packed into $OUT/refresh.tgz after every step.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/refresh; mkdir -p $OUT $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/refresh.tgz .); }
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ep_bench.py --reps 5 --out $W/kernel_ep2_bench.json > $W/ep_bench.log 2>&1; stamp "ep_bench rc=$?"; grep "^|" $W/ep_bench.log
timeout 200 python3 benchmarks/kernel_bench.py --reps 10 --out $W/kernel_bench.json > $W/bench.log 2>&1; stamp "bench rc=$?"; grep -E "^(megamoe|unfused|copy|trace)" $W/bench.log
timeout 60 python3 benchmarks/device/profile_stages.py $W/profile_stages.json > $W/profile.log 2>&1; stamp "profile rc=$?"
