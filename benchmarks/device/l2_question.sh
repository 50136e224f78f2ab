#!/bin/bash
# One device call for the fiftieth session's L2 question (benchmarks/NOTES_kernel.md, "Fiftieth
# session"): does the L2 cache's rate to the SMs bound the SM90 kernel at large token counts?
#   1. tma_probe: the copy engine's rates, now with all SMs re-reading one shared L2 window
#      (-> $OUT/tma_probe.json; the committed one is benchmarks/results/tma_probe_h200.json)
#   2. Nsight Compute's SpeedOfLight and MemoryWorkloadAnalysis sections on the kernel at
#      $TOKENS (default "4096 8192"): L2, DRAM and L1 throughputs (-> $OUT/ncu.tgz)
# Carry build/kernel (the committed build); nothing here changes GPU settings (ncu runs with
# --clock-control none). Predictions before the run: NOTES_kernel.md.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
timeout 180 python3 benchmarks/device/tma_probe.py $OUT/tma_probe.json; echo "tma_probe rc=$?"
TOKENS=${TOKENS:-4096 8192} SECTIONS="SpeedOfLight MemoryWorkloadAnalysis" OUT=$OUT bash benchmarks/device/ncu_x2.sh
