#!/usr/bin/env python3
"""Merge the outputs of `sluice generate|score --shard K/N` into input order.

Shard K holds blocks K, K+N, K+2N, ... of --batch-size lines each, so the
merge takes --batch-size lines from shard 0, then from shard 1, ... in turn.

    tools/merge_shards.py --batch-size 8 --input in.jsonl out.0.jsonl ... > out.jsonl

The input and the shards may be zstd-compressed (names ending in .zst, as
sluice reads and writes them); they are read through the `zstd` command,
which must then be installed.  The merged output is plain JSON Lines (pipe
it through `zstd` to compress it).

Give every shard file, in order K = 0 .. N-1, the job's --batch-size and
its input.  Everything is checked before a line is written: each shard's
line count against what shard K of N holds of the input, and every merged
line's id against the input line it answers (its "id", or its 1-based line
number), so a missing shard, shards out of order, a wrong --batch-size, a
truncated shard or another job's output is refused (exit 1, one line on
stderr) and nothing is written.
"""
import argparse
import contextlib
import json
import shutil
import subprocess
import sys


def fail(msg):
    sys.exit(f"merge_shards: {msg}")


@contextlib.contextmanager
def open_lines(path):
    """A binary stream of the file's lines; a name ending in .zst is
    decompressed as it is read, by the zstd command (which checks the
    frames' checksums and refuses truncated data)."""
    if not path.endswith(".zst"):
        with open(path, "rb") as f:
            yield f
        return
    if shutil.which("zstd") is None:
        fail(f"{path}: reading .zst files needs the zstd command (apt-get install zstd)")
    with open(path, "rb") as f:  # OSError (a missing file) as for plain files
        p = subprocess.Popen(["zstd", "-dcq"], stdin=f, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            yield p.stdout
            p.stdout.read()  # whatever the caller left: the whole stream is checked
        finally:
            p.stdout.close()
            err = p.stderr.read().decode(errors="replace").strip().splitlines()
            p.stderr.close()
            rc = p.wait()
    if rc != 0:
        why = err[-1].replace("/*stdin*\\", "").lstrip(" :") if err else f"zstd exit status {rc}"
        fail(f"{path}: not valid zstd data: {why}")


def input_ids(path):
    """(line number, id) of each input line sluice reads: the id is the
    line's "id", or its line number."""
    ids = []
    with open_lines(path) as f:
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a byte-order mark, as sluice reads it
            line = raw.rstrip(b"\r\n")
            if not line.strip(b" \t"):
                continue  # blank lines are skipped
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None  # a bad line (--skip-bad-lines) keeps its number
            ids.append((n, obj["id"] if isinstance(obj, dict) and "id" in obj else n))
    return ids


def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def shard_lines(path):
    with open_lines(path) as f:
        lines = f.readlines()
    if lines and not lines[-1].endswith(b"\n"):
        fail(f"{path} ends with a partial line")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--input", required=True, help="the job's input JSON Lines")
    ap.add_argument("shards", nargs="+")
    a = ap.parse_args()
    if a.batch_size < 1:
        fail("--batch-size must be at least 1")
    try:
        want = input_ids(a.input)
        shards = [shard_lines(p) for p in a.shards]
    except OSError as e:
        fail(str(e))
    n, b = len(shards), a.batch_size
    nblocks = (len(want) + b - 1) // b
    # shard k holds blocks k, k + n, ...: check every count first
    for k, lines in enumerate(shards):
        expect = sum(min(b, len(want) - blk * b) for blk in range(k, nblocks, n))
        if len(lines) != expect:
            fail(f"{a.shards[k]} has {len(lines)} lines where shard {k} of {n} of "
                 f"{a.input} (--batch-size {b}) has {expect}: a shard missing or "
                 "out of order, another --batch-size, or an unfinished shard")
    merged = []
    pos = [0] * n
    for blk in range(nblocks):
        k = blk % n
        count = min(b, len(want) - blk * b)
        merged += [(k, i) for i in range(pos[k], pos[k] + count)]
        pos[k] += count
    for line_no, (k, i) in enumerate(merged):
        try:
            got = json.loads(shards[k][i])["id"]
        except (ValueError, KeyError, TypeError):
            fail(f"{a.shards[k]}:{i + 1}: not an output line of sluice")
        n_in, id_in = want[line_no]
        if canon(got) != canon(id_in):
            fail(f"{a.shards[k]}:{i + 1}: id {canon(got)} where {a.input}:{n_in} "
                 f"has id {canon(id_in)}: "
                 "shards out of order, another --batch-size, or another job's output")
    out = sys.stdout.buffer
    for k, i in merged:
        out.write(shards[k][i])
    out.flush()


if __name__ == "__main__":
    main()
