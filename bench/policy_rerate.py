#!/usr/bin/env python3
"""Re-predict a policy_validate.sh run's disk runs with each run's own disk rate.

The profile's disk read rate is measured once, at the start of a validation
run; every `sluice bench` run that uses the disk also probes the disk beside
itself (probe_read_gbps, the same 1 GiB O_DIRECT probe).  On a VM whose disk
rate moves, the two differ, and the cost model's error on the disk runs is
then mostly the rate's error.  This script separates the two: for each grid
run that read the disk it writes a copy of the profile with disk_read_gbps =
the run's probe (disk_write_gbps scaled alike), rebuilds the run's policy from
its record, and asks `sluice policy --evaluate` for the prediction; then it
prints the per-run errors and the grid's median and 90th percentile both ways.
Nothing is measured: it only re-runs the cost model.

With --patch PATCH.json it re-predicts every grid run instead, with the
run's profile updated by the fields of PATCH.json (a JSON object, e.g. rates
a later profile measured that the run's lacks) and the disk rate as
measured: a change to the cost model or the profile checked against
recorded measurements.

usage: bench/policy_rerate.py RESULTS.jsonl [SLUICE] [--patch PATCH.json]   (SLUICE default build/sluice)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

POLICY_FIELDS = ("gpu_batch_size", "num_gpu_batches", "w_gpu_percent", "w_cpu_percent",
                 "cache_gpu_percent", "cache_cpu_percent", "act_gpu_percent", "act_cpu_percent",
                 "cpu_cache_compute", "overlap", "sep_layer", "hh_ratio", "recent_ratio",
                 "compress_cache")


def quantile(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]


def bench_args(cmd):
    """The model, workload and budget flags of a recorded `sluice bench` command."""
    args = cmd.split()
    args = args[args.index("bench") + 1:]
    out, k = [], 0
    while k < len(args):
        if args[k] in ("--policy", "--profile"):
            k += 2
        elif args[k] == "--json":
            k += 1
        else:
            out.append(args[k])
            k += 1
    return out


def main():
    argv = sys.argv[1:]
    patch = None
    if "--patch" in argv:
        i = argv.index("--patch")
        patch = json.load(open(argv[i + 1]))
        del argv[i:i + 2]
    if not argv:
        sys.exit(__doc__.strip().splitlines()[-1])
    sluice = argv[1] if len(argv) > 1 else "build/sluice"
    recs = [json.loads(line) for line in open(argv[0])]
    prof = recs[0]
    if prof.get("format") != "sluice-profile":
        sys.exit(f"{argv[0]}: the first line is not the run's profile")
    before, after = [], []
    with tempfile.TemporaryDirectory() as tmp:
        pf, pol = os.path.join(tmp, "profile.json"), os.path.join(tmp, "policy.json")
        for r in recs[1:]:
            if r.get("kind") != "grid":
                continue
            meas, pred = r["throughput_tok_s"], r["predicted_throughput_tok_s"]
            e0 = abs(pred - meas) / meas
            before.append(e0)
            p = dict(prof)
            if patch is not None:
                p.update(patch)
            elif not r.get("disk_read_bytes") or not r.get("probe_read_gbps"):
                after.append(e0)
                continue
            else:
                scale = r["probe_read_gbps"] / prof["disk_read_gbps"]
                p["disk_read_gbps"] = r["probe_read_gbps"]
                if p.get("disk_write_gbps"):
                    p["disk_write_gbps"] = prof["disk_write_gbps"] * scale
            json.dump(p, open(pf, "w"))
            json.dump({k: r[k] for k in POLICY_FIELDS if k in r}, open(pol, "w"))
            args = bench_args(r["cmd"])
            for i, a in enumerate(args):  # the disk tier's folder must exist to plan for it
                if a == "--offload-dir":
                    os.makedirs(args[i + 1], exist_ok=True)
            res = subprocess.run([sluice, "policy", *args, "--profile", pf, "--evaluate", pol, "--json"],
                                 capture_output=True, text=True)
            if res.returncode:
                sys.exit(f"{r['model']} {r['policy']}: {res.stderr.strip()}")
            pn = json.loads(res.stdout)["throughput_tok_s"]
            e1 = abs(pn - meas) / meas
            after.append(e1)
            print(f"| {r['model']} | {r['workload']} | {r['policy']} | {r.get('probe_read_gbps') or 0:.2f} | "
                  f"{meas:.2f} | {pred:.2f} ({100 * e0:.1f}%) | {pn:.2f} ({100 * e1:.1f}%) |")
    print(f"\nprofile's disk rate {prof['disk_read_gbps']:.2f} GB/s: median {100 * statistics.median(before):.1f}%, "
          f"90th percentile {100 * quantile(before, 0.9):.1f}% over {len(before)} runs")
    how = "patched profile" if patch is not None else "each run's own disk rate"
    print(f"{how}: median {100 * statistics.median(after):.1f}%, "
          f"90th percentile {100 * quantile(after, 0.9):.1f}%")


if __name__ == "__main__":
    main()
