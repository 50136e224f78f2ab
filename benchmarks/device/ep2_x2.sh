#!/bin/bash
# One x2 device call that re-records the EP2 side alone, for a build whose EP1 side (suite,
# sanitizers, traces, benchmark) is already recorded: the EP2 job (cases + dead rank) and its
# pytest, the EP2 traces, the EP2 benchmark and where the EP call's host time goes. Packed
# into $OUT/ep2.tgz after every step, so a run cut short still returns what it finished.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/ep2; mkdir -p $OUT $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/ep2.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1; nvidia-smi topo -m >> $W/gpu.txt 2>&1
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
. benchmarks/device/ep2_checks.sh  # EP job (cases, dead rank) and its pytest
OUT=$W timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/traces_ep2.py > $W/traces_ep2.log 2>&1; stamp "EP2 traces rc=$?"; grep "^{'tokens" $W/traces_ep2.log
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ep_bench.py --reps 5 --out $W/kernel_ep2_bench.json > $W/ep_bench.log 2>&1; stamp "ep_bench rc=$?"; grep "^|" $W/ep_bench.log
timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/ep_host_profile.py $W/ep_host_profile.txt > $W/ep_host.log 2>&1; stamp "EP host profile rc=$?"
