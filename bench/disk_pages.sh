#!/usr/bin/env bash
# The disk tier's buffers: O_DIRECT reads into 4 KiB pages against
# transparent huge pages, side by side (sl_io_alloc, common/sl_common.h).
# Reads one file of the folder's disk with bench/disk_read.c (io_uring,
# O_DIRECT, as sluice's stores read) in three request shapes, alternating
# the two kinds of pages, ROUNDS times; and where SLUICE_BEFORE names a
# sluice build from before sl_io_alloc, the disk rates `sluice profile`
# measures with it and with SLUICE, alternately.
#
# Environment (defaults): DIR=/tmp/sluice-disk-pages (a folder on the disk
#   to measure), MIB=1200 (each read), ROUNDS=4, SLUICE=build/sluice,
#   SLUICE_BEFORE= (none)
# Needs cc and liburing (the project's own dependencies).
# Writes bench/results/disk-pages-<UTC date-time>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-/tmp/sluice-disk-pages}
MIB=${MIB:-1200}
ROUNDS=${ROUNDS:-4}
SLUICE=${SLUICE:-build/sluice}
SLUICE_BEFORE=${SLUICE_BEFORE:-}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/disk-pages-$stamp.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIR"
cc -O2 -std=c11 -Wall -o "$work/disk_read" bench/disk_read.c -luring
f=$DIR/disk-pages.bin
if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -ne $((MIB << 20)) ]; then
	head -c $((MIB << 20)) /dev/urandom >"$work/src"
	dd if="$work/src" of="$f" bs=4M oflag=direct conv=fsync status=none
	rm "$work/src"
fi
dev=$(basename "$(df --output=source "$DIR" | tail -1)")
q=/sys/block/${dev%%[0-9]*}/queue
[ -d "$q" ] || q=/sys/block/$dev/queue
segs=$(cat "$q/max_segments" 2>/dev/null || echo "?")
maxkb=$(cat "$q/max_sectors_kb" 2>/dev/null || echo "?")
thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo "?")
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= ROUNDS; r++)); do
	for shape in "1024 32" "4096 8" "16384 1"; do
		for pages in 4k huge; do
			# shellcheck disable=SC2086
			"$work/disk_read" "$f" $shape "$MIB" "$pages" | tee -a "$work/reads.txt" >&2
		done
	done
	if [ -n "$SLUICE_BEFORE" ]; then
		for b in "$SLUICE_BEFORE" "$SLUICE"; do
			"$b" profile --backend cpu --offload-dir "$DIR" --json "$work/p.json" >/dev/null 2>&1
			python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], d["disk_read_gbps"], d["disk_segment_read"]["gbps"][1])' \
				"$work/p.json" "$("$b" version | tr -d '(;' | awk '{print $3}')" | tee -a "$work/profiles.txt" >&2
		done
	fi
done
touch "$work/profiles.txt"
python3 - "$work/reads.txt" "$work/profiles.txt" "$out" <<PY
import re, statistics, sys
reads, profs, out = sys.argv[1:]
rows = {}
for l in open(reads):
    m = re.match(r"(\S+)\s+pages, +(\d+) KiB x +(\d+) in flight: .*, ([0-9.]+) GB/s", l)
    rows.setdefault((int(m.group(2)), int(m.group(3))), {}).setdefault(m.group(1), []).append(float(m.group(4)))
md = ["# O_DIRECT reads into 4 KiB pages against transparent huge pages (bench/disk_pages.sh, $stamp UTC)", "",
      "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB; "
      "disk $dev (max_segments $segs, max_sectors_kb $maxkb); transparent_hugepage: $thp; "
      "load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end.", "",
      "Command: \`DIR=$DIR MIB=$MIB ROUNDS=$ROUNDS SLUICE=$SLUICE SLUICE_BEFORE=$SLUICE_BEFORE bench/disk_pages.sh\`", "",
      "Each read: $MIB MiB of one file through io_uring with O_DIRECT (bench/disk_read.c), the two kinds "
      "of pages alternating; GB/s, the median of $ROUNDS rounds (every round's figure after it).", "",
      "| request | in flight | 4 KiB pages | huge pages | huge / 4 KiB |", "|---|---:|---:|---:|---:|"]
for (kib, depth), v in rows.items():
    a, b = statistics.median(v["4k"]), statistics.median(v["huge"])
    md.append(f"| {kib} KiB | {depth} | {a:.2f} ({' '.join(f'{x:.2f}' for x in v['4k'])}) | "
              f"{b:.2f} ({' '.join(f'{x:.2f}' for x in v['huge'])}) | {b / a:.2f}x |")
pr = [l.split() for l in open(profs)]
if pr:
    md += ["", "\`sluice profile --backend cpu --offload-dir DIR\`: its disk_read_gbps (16 MiB requests, 4 "
           "outstanding, in 1 MiB chunks) and its 1 MiB segment read, GB/s, each build's median and every round's:", "",
           "| build | disk_read_gbps | segment read, 1 MiB |", "|---|---:|---:|"]
    for b in dict.fromkeys(p[0] for p in pr):
        x = [float(p[1]) for p in pr if p[0] == b]
        y = [float(p[2]) for p in pr if p[0] == b]
        md.append(f"| {b} | {statistics.median(x):.2f} ({' '.join(f'{v:.2f}' for v in x)}) | "
                  f"{statistics.median(y):.2f} ({' '.join(f'{v:.2f}' for v in y)}) |")
open(out, "w").write("\n".join(md) + "\n")
PY
echo "wrote $out" >&2
