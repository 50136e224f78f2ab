#!/bin/bash
# One x2 device call: EP2 traces for issue 7, the EP1 GPU suite, the trace-overhead A/B.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/traces_ep2.py > $OUT/traces_ep2.log 2>&1
echo "traces_ep2 rc=$?"; grep -v "^\s*$" $OUT/traces_ep2.log | grep -iv "warn\|OMP_NUM\|\*\*\*" | tail -8 | cut -c1-400
[ -n "$SUITE" ] && { timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py > $OUT/pytest.log 2>&1; tail -4 $OUT/pytest.log; }
[ -n "$SUITE" ] && { timeout 90 python3 benchmarks/kernel_bench.py --tokens 4096 --reps 10 --no-peer --out $OUT/kernel_bench_trace_overhead.json > $OUT/bench.log 2>&1; tail -3 $OUT/bench.log; }
rm -f $OUT/kernel_trace_t4096.json
(cd $OUT && tar czf ep_traces.tgz --exclude ep_traces.tgz * && find . -maxdepth 1 -type f ! -name ep_traces.tgz -delete)
