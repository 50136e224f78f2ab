# Sourced by the device scripts (needs $W and stamp): the EP1 GPU suite and the one-GPU EP tests
# (ep1_suite.sh), then compute-sanitizer on small launches (sanitize.sh: eight processes, 127 s on
# one H200 in session 48).
. benchmarks/device/ep1_suite.sh
. benchmarks/device/sanitize.sh
