#!/bin/bash
# One x2 device call after a kernel change: EP1 GPU suite, EP1 traces (issue 7), the EP1
# benchmark with its peer, the EP2 job (cases + dead rank) and pytest, EP2 traces. One archive.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 100 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $OUT/pytest.log 2>&1; stamp "EP1 suite: $(tail -1 $OUT/pytest.log)"
timeout 90 python3 benchmarks/device/traces.py > $OUT/traces.log 2>&1; stamp "EP1 traces rc=$?"; grep "^{'tokens" $OUT/traces.log
timeout 150 python3 benchmarks/kernel_bench.py --reps 10 --out $OUT/kernel_bench.json > $OUT/bench.log 2>&1; stamp "bench rc=$?"; grep -E "^(megamoe|unfused|copy|trace)" $OUT/bench.log
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part cases --out $OUT/kernel_ep2_tests.json > $OUT/ep_job.log 2>&1; stamp "EP job rc=$?"
timeout 45 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part dead --out $OUT/kernel_ep2_tests_dead.json >> $OUT/ep_job.log 2>&1; stamp "EP dead rc=$?"
MEGAMOE_EP_REPORT=$OUT/kernel_ep2_tests.json timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_ep.py -k "not local" > $OUT/ep_pytest.log 2>&1; stamp "EP pytest: $(tail -1 $OUT/ep_pytest.log)"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/traces_ep2.py > $OUT/traces_ep2.log 2>&1; stamp "EP2 traces rc=$?"; grep "^{'tokens" $OUT/traces_ep2.log
rm -f $OUT/kernel_trace_t4096.json
(cd $OUT && tar czf session.tgz --exclude session.tgz * && find . -maxdepth 1 -type f ! -name session.tgz -delete)
