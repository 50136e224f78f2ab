#!/bin/bash
# One x2 device call after a kernel change (part 1 of 2; refresh_x2.sh is part 2): the EP1 GPU
# suite and the one-GPU EP tests, EP1 traces at every benchmark size (issue 7), plan-choice
# timings, the EP2 job (cases + dead rank) and its pytest, EP2 traces. Results are packed into
# $OUT/session.tgz after every step, so a run cut short still returns what it finished.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; W=/tmp/session; mkdir -p $OUT $W
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; (cd $W && tar czf $OUT/session.tgz .); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $W/pytest.log 2>&1; stamp "EP1 suite: $(tail -1 $W/pytest.log)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local > $W/ep_local.log 2>&1; stamp "EP local: $(tail -1 $W/ep_local.log)"
OUT=$W timeout 120 python3 benchmarks/device/traces.py > $W/traces.log 2>&1; stamp "EP1 traces rc=$?"; grep "^{'tokens" $W/traces.log
OUT=$W timeout 80 python3 benchmarks/device/plan_choices.py > $W/plan_choices.log 2>&1; stamp "plan choices rc=$?"
. benchmarks/device/ep2_checks.sh  # EP job (cases, dead rank) and its pytest
OUT=$W timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/traces_ep2.py > $W/traces_ep2.log 2>&1; stamp "EP2 traces rc=$?"; grep "^{'tokens" $W/traces_ep2.log
