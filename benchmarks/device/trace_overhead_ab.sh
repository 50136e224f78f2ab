#!/bin/bash
# One device call: trace overhead (trace_overhead.py, six pairs at 64 / 4096 / 8192 tokens) of this
# tree and of out/ab_v66 (an exported commit with its build, see ab_x2.sh), twice, after the EP1
# GPU suite and the one-GPU EP tests of this tree.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c "import megamoe.kernel as k; print(k.build().path)"
timeout 60 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/test_kernel_gpu.py 2>&1 | tail -2
timeout 40 python3 -m pytest -q -p no:cacheprovider --timeout 40 tests/test_kernel_ep.py -k local 2>&1 | tail -1
for i in 1 2; do
  echo "== new"; timeout 90 python3 benchmarks/device/trace_overhead.py /tmp/tro_new$i.json 2>&1 | tail -3
  echo "== old (v6.6)"; (cd out/ab_v66 && PYTHONPATH=$PWD timeout 90 python3 benchmarks/device/trace_overhead.py /tmp/tro_old$i.json 2>&1 | tail -3)
done
