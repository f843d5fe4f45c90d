#!/usr/bin/env python3
"""Merge the outputs of `sluice generate|score --shard K/N` into input order.

Shard K holds blocks K, K+N, K+2N, ... of --batch-size lines each, so the
merge takes --batch-size lines from shard 0, then from shard 1, ... in turn.

    tools/merge_shards.py --batch-size 8 out.0.jsonl out.1.jsonl ... > out.jsonl

Give the shard files in order K = 0 .. N-1.  Fails (exit 1) if a shard is
missing lines or has lines left over, so a truncated shard is never merged
silently.
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("shards", nargs="+")
    a = ap.parse_args()
    files = [open(p, "rb") for p in a.shards]
    out = sys.stdout.buffer
    k = 0
    while True:
        first = files[k].readline()
        if not first:
            # block order is round robin: when shard k has no next block,
            # no block follows at all
            for j, f in enumerate(files):
                if f.readline():
                    sys.exit(f"merge_shards: {a.shards[j]} has lines after the job's last block")
            return
        line = first
        for i in range(a.batch_size):
            if i:
                line = files[k].readline()
                if not line:
                    break  # the job's last, short block
            if not line.endswith(b"\n"):
                sys.exit(f"merge_shards: {a.shards[k]} ends with a partial line")
            out.write(line)
        k = (k + 1) % len(files)

if __name__ == "__main__":
    main()
