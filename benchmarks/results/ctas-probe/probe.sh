#!/usr/bin/env bash
# ncu on one point where `min-ctas = 1024` costs 25-60% with its gate closed (fp16 head 128 block 16 v1,
# batch 2, context 512, GQA 32/8: 64 CTAs), stock and three tune-15 candidates: what differs at run time.
#   OUT=... bash benchmarks/results/ctas-probe/probe.sh LIBDIR     (LIBDIR: libs.txt + the .so.xz files)
set -uo pipefail
L=$1; U=/tmp/probe-libs; mkdir -p $U $OUT
LIBS=()
while IFS= read -r line; do
  name=${line%%=*}; rest=${line#*=}; file=${rest%:*}; prefix=${rest##*:}
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $L/$file.xz $U/$file
  LIBS+=(--lib "$name=$U/$file:$prefix")
done < $L/libs.txt
POINT=(--dtypes fp16 --batches 2 --contexts 512 --heads 32/8 --head-sizes 128 --block-sizes 16 --kv auto --kernels v1)
# the timings first (bench's own method), then ncu over a short run of the same point
python3 -m kvpatch bench "${LIBS[@]}" --variant-info $L/variants.json "${POINT[@]}" --reps 50 --rounds 3 --no-cold \
  --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc $?"; grep -A8 "speedup\|geomean" $OUT/bench.log | head -20
timeout 150 ncu --clock-control none --kernel-name regex:paged_attention_v1_kernel --launch-skip 8 --launch-count 8 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section InstructionStats \
  --metrics smsp__inst_executed.sum,smsp__cycles_active.avg,gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum \
  --csv --page details \
  python3 -m kvpatch bench "${LIBS[@]}" --variant-info $L/variants.json "${POINT[@]}" --reps 2 --rounds 1 --warmup 1 --no-cold --no-check \
  > $OUT/ncu.csv 2> $OUT/ncu.err; echo "ncu rc $?"; tail -3 $OUT/ncu.err
python3 - $OUT/ncu.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
h = rows[0]; idx = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
want = ("Duration", "Registers Per Thread", "Grid Size", "Block Size", "Dynamic Shared Memory Per Block", "Achieved Occupancy",
        "Executed Instructions", "smsp__inst_executed.sum", "Warp Cycles Per Issued Instruction", "DRAM Throughput",
        "L2 Hit Rate", "dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum", "Theoretical Occupancy", "Waves Per SM")
by = collections.defaultdict(dict)
for r in rows[1:]:
    if r[idx["Metric Name"]] in want:
        by[(r[idx["ID"]], r[idx["Kernel Name"]].split("::")[0].split("(")[0][-40:])][r[idx["Metric Name"]]] = r[idx["Metric Value"]] + " " + r[idx["Metric Unit"]]
for k, m in by.items():
    print(k); [print("   ", w, m[w]) for w in want if w in m]
PY
