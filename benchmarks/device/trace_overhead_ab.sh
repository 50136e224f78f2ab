#!/bin/bash
# One device call: trace overhead (trace_overhead.py, six pairs at 64 / 4096 / 8192 tokens) of this
# tree and of an old one ($OLD, default out/ab_old: an exported commit with its build, see
# ab_x2.sh), twice, after the EP1 GPU suite and the one-GPU EP tests of this tree and a bitwise
# comparison of the two trees' outputs (same_outputs.py; equal when only the trace changed).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
ROOT=$PWD; OLD=$ROOT/${OLD:-out/ab_old}
python3 -c "import megamoe.kernel as k; print(k.build().path)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py 2>&1 | tail -2
timeout 40 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local 2>&1 | tail -1
timeout 90 python3 benchmarks/device/same_outputs.py save /tmp/out_new.pt > /dev/null 2>&1
(cd $OLD && PYTHONPATH=$OLD timeout 90 python3 $ROOT/benchmarks/device/same_outputs.py save /tmp/out_old.pt > /dev/null 2>&1)
python3 benchmarks/device/same_outputs.py compare /tmp/out_old.pt /tmp/out_new.pt
for i in 1 2; do
  echo "== new"; timeout 90 python3 benchmarks/device/trace_overhead.py /tmp/tro_new$i.json 2>&1 | tail -3
  echo "== old"; (cd $OLD && PYTHONPATH=$OLD timeout 90 python3 $ROOT/benchmarks/device/trace_overhead.py /tmp/tro_old$i.json 2>&1 | tail -3)
done
