#!/bin/bash
# One device call for issue 6 (expert parallelism). Usage (device, repo root; carry
# build/kernel/<hash> and build/ep_old):   bash benchmarks/device/ep_run.sh
# With 2+ GPUs: the torchrun EP job (tests/test_kernel_ep.py as a script, NVLink, symmetric
# memory) + its pytest, the EP2 benchmark; always: EP1 old-vs-new bitwise check, the EP1 GPU
# suite, and the one-GPU EP2 tests (two SM-partitioned ranks in one process).
# $OUT (at most 8 files back): log.txt, ep_job.log, ep_bench.log, kernel_ep2_tests.json,
# kernel_ep2_tests_dead.json, kernel_ep2_bench.json, the trace (1 GPU: the EP1 logs instead).
set -o pipefail
MODE=${1:-full}
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
LOG=$OUT/log.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
NG=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv; nvidia-smi topo -m; } >> $LOG 2>&1
stamp "GPUs: $NG; build"
python3 -c "from megamoe.kernel import build; r = build(verbose=True); print(r.path, 'cached' if r.cached else 'built')" 2>&1 | tail -6 | tee -a $LOG || { stamp "build failed"; exit 1; }
if [ "$NG" -ge 2 ]; then
  stamp "EP job (torchrun, 2 ranks)"
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part cases --out $OUT/kernel_ep2_tests.json > $OUT/ep_job.log 2>&1
  stamp "EP job rc=$?"; grep -v "^\s*$" $OUT/ep_job.log | grep -iv "warn" | tail -25 | cut -c1-700 | tee -a $LOG
  timeout 45 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part dead --out $OUT/kernel_ep2_tests_dead.json >> $OUT/ep_job.log 2>&1
  stamp "EP dead-rank job rc=$?"; grep "dead-rank\|dead_rank" $OUT/ep_job.log | tail -8 | cut -c1-400 | tee -a $LOG
  if [ -f $OUT/kernel_ep2_tests.json ]; then
    MEGAMOE_EP_REPORT=$OUT/kernel_ep2_tests.json timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_ep.py -k "not local" 2>&1 | tail -12 | cut -c1-600 | tee -a $LOG
  fi
fi
stamp "EP2 on one GPU (two SM-partitioned ranks)"
LL=$OUT/ep_pytest_local.log; [ "$NG" -ge 2 ] && LL=/tmp/ep_pytest_local.log
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 30 tests/test_kernel_ep.py -k local > $LL 2>&1
stamp "local rc=$?"; grep -E "passed|failed|Error|assert" $LL | tail -12 | cut -c1-500 | tee -a $LOG
if [ "$MODE" = full ]; then
stamp "EP1 old-vs-new bitwise"
timeout 35 python3 benchmarks/device/ep_ep1_compat.py build/ep_old/libmegamoe_sm90_head.so $OUT/ep1_compat.json 2>&1 | tail -9 | tee -a $LOG
stamp "EP1 GPU suite"
timeout 60 python3 -m pytest -x -q -p no:cacheprovider --timeout 40 tests/test_kernel_gpu.py -k "tiny or zero or all_masked or trace or timeout or deterministic or plan or test_v4_flash and (1000 or 128)" > $OUT/ep1_pytest.log 2>&1
stamp "EP1 suite rc=$?"; tail -4 $OUT/ep1_pytest.log | tee -a $LOG
fi
if [ "$NG" -ge 2 ]; then
  stamp "EP2 benchmark"
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ep_bench.py --reps 5 --out $OUT/kernel_ep2_bench.json > $OUT/ep_bench.log 2>&1
  stamp "bench rc=$?"; grep -v "^\s*$" $OUT/ep_bench.log | grep -iv "warn" | tail -24 | cut -c1-900 | tee -a $LOG
fi
stamp "done"
(cd $OUT && tar czf ep_logs.tgz *.log *.json *.txt 2>/dev/null)
