# Sourced by the device scripts (needs $W and stamp): the EP1 GPU suite and the one-GPU EP tests
# (two SM-partitioned ranks).
# (400 s: on the H100 of session 51 the suite ran past 300 s; SUITE_TIMEOUT overrides it)
timeout ${SUITE_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider --timeout 120 tests/test_kernel_gpu.py > $W/pytest.log 2>&1; stamp "EP1 suite: $(tail -1 $W/pytest.log)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local > $W/ep_local.log 2>&1; stamp "EP local: $(tail -1 $W/ep_local.log)"
