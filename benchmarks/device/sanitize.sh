# Sourced by the device scripts (needs $W and stamp): compute-sanitizer on the small launches of
# sanitize_small.py: memcheck and synccheck over every case in one process each, racecheck with
# each case in a process of its own (one process's racecheck mixes the cases' hazards).
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/device/sanitize_small.py > $W/sanitizer_$tool.log 2>&1
  stamp "compute-sanitizer $tool rc=$?: $(grep -E "SUMMARY|sanitize_small" $W/sanitizer_$tool.log | tr '\n' ' ')"
done
for case in small wide wide_pair ring pair pair_ring m128; do
  timeout 100 compute-sanitizer --tool racecheck --print-limit 20 python3 benchmarks/device/sanitize_small.py $case > $W/sanitizer_racecheck_$case.log 2>&1
  stamp "compute-sanitizer racecheck $case rc=$?: $(grep -E "SUMMARY|sanitize_small" $W/sanitizer_racecheck_$case.log | tr '\n' ' ')"
done
