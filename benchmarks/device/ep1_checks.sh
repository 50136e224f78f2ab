# Sourced by the device scripts (needs $W and stamp): the EP1 GPU suite, the one-GPU EP tests
# (two SM-partitioned ranks), and compute-sanitizer memcheck / racecheck / synccheck on a
# small launch.
timeout 300 python3 -m pytest -q -p no:cacheprovider --timeout 120 tests/test_kernel_gpu.py > $W/pytest.log 2>&1; stamp "EP1 suite: $(tail -1 $W/pytest.log)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local > $W/ep_local.log 2>&1; stamp "EP local: $(tail -1 $W/ep_local.log)"
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/device/sanitize_small.py > $W/sanitizer_$tool.log 2>&1
  stamp "compute-sanitizer $tool rc=$?: $(grep -E "SUMMARY|sanitize_small" $W/sanitizer_$tool.log | tr '\n' ' ')"
done
