# The EP2 correctness checks on two GPUs, sourced by the x2 device scripts (they set W and
# stamp): the torchrun job's cases, then the dead-rank case (its own job, so that a hang there
# cannot lose the cases), then the pytest that reads both reports.
timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part cases --out $W/kernel_ep2_tests.json > $W/ep_job.log 2>&1; stamp "EP job rc=$?"
timeout 40 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_kernel_ep.py --part dead --out $W/kernel_ep2_tests_dead.json >> $W/ep_job.log 2>&1; stamp "EP dead rc=$?"
MEGAMOE_EP_REPORT=$W/kernel_ep2_tests.json timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_ep.py -k "not local" > $W/ep_pytest.log 2>&1; stamp "EP pytest: $(tail -1 $W/ep_pytest.log)"
# the CLI's multi-process run (issue 6: megamoe run --ranks 2 starts torchrun), with traces and
# skewed routing, and one bad input (more ranks than GPUs: one line, exit 2)
timeout 120 python3 -m megamoe.cli run --ranks 2 --tokens 512 --reps 5 --trace $W/cli_ep2_t512.json > $W/cli_run.log 2>&1; stamp "megamoe run --ranks 2 rc=$?: $(grep -iE "us|check" $W/cli_run.log | tail -3 | tr '\n' ' ')"
timeout 120 python3 -m megamoe.cli run --ranks 2 --tokens 300 --routing zipf --reps 3 >> $W/cli_run.log 2>&1; stamp "megamoe run --ranks 2 --routing zipf rc=$?"
timeout 60 python3 -m megamoe.cli run --ranks 3 --tokens 8 > $W/cli_bad.log 2>&1; stamp "megamoe run --ranks 3 (2 GPUs) rc=$?: $(tail -2 $W/cli_bad.log | tr '\n' ' ')"
