#!/bin/bash
# One device call: Nsight Compute on the SM90 kernel (3rd launch) at the token counts in
# $TOKENS (default "256 4096"): warp-state and scheduler statistics and per-instruction stall
# samples (SourceCounters), as text in $OUT/ncu.tgz. --clock-control none keeps the GPU's own
# clocks (never change GPU settings on the lent machines). Summarize the unpacked tarball here
# with benchmarks/device/ncu_summary.py (-> benchmarks/results/kernel_ncu_h200.json).
# $SECTIONS replaces the sections (e.g. SECTIONS="SpeedOfLight MemoryWorkloadAnalysis" for the L2
# and DRAM throughputs, the fiftieth session's L2-to-SM question; then no SASS page is needed).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; W=/tmp/ncu; mkdir -p $OUT $W
for T in ${TOKENS:-256 4096}; do
  timeout 240 ncu --clock-control none --kernel-name regex:megamoe_sm90 --launch-skip 2 --launch-count 1 \
    $(for s in ${SECTIONS:-WarpStateStats SchedulerStats SourceCounters LaunchStats}; do echo --section $s; done) \
    -o $W/t$T -f python3 benchmarks/device/ncu_launch.py $T > $W/run_t$T.log 2>&1
  echo "T=$T ncu rc=$?"; tail -2 $W/run_t$T.log
  ncu --import $W/t$T.ncu-rep --page details > $W/details_t$T.txt 2>&1
  ncu --import $W/t$T.ncu-rep --page source --csv --print-source sass > $W/sass_t$T.csv 2>/dev/null
  grep -E "Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Active Warps|Stall|L2 Cache Throughput|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|Duration" $W/details_t$T.txt | head -24
  (cd $W && tar czf $OUT/ncu.tgz --exclude '*.ncu-rep' .)
done
