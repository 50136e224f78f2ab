# The EP2 correctness checks on two GPUs, sourced by the x2 device scripts (they set W and
# stamp): the torchrun job's cases, then the dead-rank case (its own job, so that a hang there
# cannot lose the cases), then the pytest that reads both reports.
timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part cases --out $W/kernel_ep2_tests.json > $W/ep_job.log 2>&1; stamp "EP job rc=$?"
timeout 40 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part dead --out $W/kernel_ep2_tests_dead.json >> $W/ep_job.log 2>&1; stamp "EP dead rc=$?"
MEGAMOE_EP_REPORT=$W/kernel_ep2_tests.json timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_ep.py -k "not local" > $W/ep_pytest.log 2>&1; stamp "EP pytest: $(tail -1 $W/ep_pytest.log)"
