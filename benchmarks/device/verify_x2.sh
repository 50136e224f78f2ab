#!/bin/bash
# One x2 device call: the whole GPU correctness suite after a kernel change, no benchmarks:
# EP1 suite + one-GPU EP tests, compute-sanitizer (memcheck / racecheck / synccheck) on a
# small launch, the EP2 job (cases + dead rank) and its pytest, and where the EP call's host
# time goes (cProfile). Packed into $OUT/verify.tgz after every step.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/verify; mkdir -p $OUT $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/verify.tgz .); }
python3 -c "import megamoe.kernel as k; print(k.build().path)" > $W/build.log 2>&1; stamp "build: $(tail -1 $W/build.log)"
. benchmarks/device/ep1_checks.sh  # EP1 suite, one-GPU EP tests, three sanitizers
. benchmarks/device/ep2_checks.sh  # EP job (cases, dead rank) and its pytest
timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/ep_host_profile.py $W/ep_host_profile.txt > $W/ep_host.log 2>&1; stamp "EP host profile rc=$?"; head -30 $W/ep_host_profile.txt
