#!/usr/bin/env python3
"""tests/test_compare.py ROOT - bench/compare.py's parsing of each system's
output and its report writer, on outputs recorded from real runs
(tests/fixtures/compare/: sluice bench --json with --policy auto, sluice
generate, the Accelerate worker, a whole --quick results file) and on
FlexGen's log format. Python's standard library only; the plots are checked
where matplotlib is installed (said on stdout where it is not)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

root = sys.argv[1]
fx = os.path.join(root, "tests", "fixtures", "compare")
sys.path.insert(0, os.path.join(root, "bench"))
import compare  # noqa: E402

fails = 0
passes = 0


def check(cond, what):
    global fails, passes
    if cond:
        passes += 1
    else:
        fails += 1
        print(f"FAIL: {what}")


def read(name):
    with open(os.path.join(fx, name)) as f:
        return f.read()


# sizes and budgets, as sluice reads sizes (powers of 1024)
check(compare.parse_size("96M") == 96 << 20, "96M")
check(compare.parse_size("1.5G") == 3 << 29, "1.5G")
check(compare.fmt_size(640 << 20) == "640M" and compare.fmt_size(1 << 30) == "1G", "fmt_size")
b = compare.parse_budget("disk:gpu=96M,cpu=64M")
check((b["name"], b["gpu"], b["cpu"]) == ("disk", 96 << 20, 64 << 20), f"parse_budget {b}")
check(compare.parse_budget("host:gpu=1G")["cpu"] is None, "an uncapped host")
check(compare.parse_budget("host:gpu=1G")["ram"] is None, "no RAM cap")
check(compare.parse_budget("d:gpu=1G,cpu=2G,ram=5G")["ram"] == 5 << 30, "a RAM cap")

# the RAM cap's cgroup: v1's memory hierarchy, or v2's where it has the
# memory controller, from /proc/self/cgroup and /proc/self/mounts
V1_MOUNTS = ("cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
             "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
             "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
V1_SELF = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
check(compare.memory_cgroup_dir(V1_SELF, V1_MOUNTS) == (1, "/sys/fs/cgroup/memory/process_api/abc"),
      f"v1 cgroup {compare.memory_cgroup_dir(V1_SELF, V1_MOUNTS)}")
check(compare.memory_cgroup_dir("0::/\n", "proc /proc proc rw 0 0\n") is None, "no cgroup mounted")
_cg = tempfile.mkdtemp()
try:
    os.makedirs(os.path.join(_cg, "user.slice"))
    with open(os.path.join(_cg, "user.slice", "cgroup.controllers"), "w") as fh:
        fh.write("cpu io memory pids\n")
    got = compare.memory_cgroup_dir("0::/user.slice\n", f"cgroup2 {_cg} cgroup2 rw 0 0\n")
    check(got == (2, os.path.join(_cg, "user.slice")), f"v2 cgroup {got}")
    with open(os.path.join(_cg, "user.slice", "cgroup.controllers"), "w") as fh:
        fh.write("cpu pids\n")
    got = compare.memory_cgroup_dir("0::/user.slice\n", f"cgroup2 {_cg} cgroup2 rw 0 0\n")
    check(got is None, f"v2 without the memory controller: {got}")
    # the page cache of a run's files is dropped: every file, its bytes
    with open(os.path.join(_cg, "a.bin"), "wb") as fh:
        fh.write(b"x" * 5000)
    check(compare.drop_page_cache([_cg, os.path.join(_cg, "missing")]) == 5000 + len("cpu pids\n"),
          "drop_page_cache's bytes")
finally:
    shutil.rmtree(_cg)

# a RAM cap that cannot be had is one line; where one can (root with a
# writable memory cgroup), a process past it is killed and one within it is not
_real = compare.memory_cgroup_dir
compare.memory_cgroup_dir = lambda *a: None
try:
    compare.RamCap(1 << 30, "t")
    check(False, "RamCap without a cgroup accepted")
except compare.ConfigError as e:
    check("needs a memory cgroup" in str(e) and "\n" not in str(e), f"RamCap without a cgroup: {e}")
compare.memory_cgroup_dir = _real
try:
    cap = compare.RamCap(64 << 20, "test")
except compare.ConfigError as e:
    cap = None
    print(f"test_compare: no RAM cap here, its limit not checked ({e})")
if cap:
    try:
        hog = [sys.executable, "-c", "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"]
        r = compare.run_proc(hog, 120, None, cap)
        u = cap.usage()
        check(r["rc"] != 0 and (u.get("cgroup_oom_kills") or 0) >= 1, f"a process past the cap: rc {r['rc']}, {u}")
    finally:
        cap.close()
    cap = compare.RamCap(256 << 20, "test2")
    try:
        r = compare.run_proc([sys.executable, "-c", "b = bytearray(16 << 20)"], 120, None, cap)
        u = cap.usage()
        check(r["rc"] == 0 and 0 < (u["cgroup_peak_bytes"] or 0) <= 256 << 20, f"a process within the cap: {r['rc']}, {u}")
    finally:
        cap.close()
    check(not os.path.exists(cap.dir), "the cgroup removed")
for bad, msg in (("disk", "want NAME:gpu=SIZE"), ("d:cpu=1G", "gpu=SIZE is required"),
                 ("d:gpu=0", "must be above 0"), ("d:gpu=1G,disk=2G", "is not gpu=SIZE, cpu=SIZE or ram=SIZE"),
                 ("d:gpu=lots", "is not a size"), ("d:gpu=1G,cpu=2G,ram=2G", "ram=2G is below gpu + cpu")):
    try:
        compare.parse_budget(bad)
        check(False, f"budget '{bad}' accepted")
    except compare.ConfigError as e:
        check(msg in str(e), f"budget '{bad}': {e}")

# sluice bench's prompt ids (tools/cmd_bench.c's xorshift; these values
# were printed by that C code compiled alone)
check(compare.bench_prompt_ids(1, 2, 3, 50272) == [[39268, 14489, 47365], [36752, 47109, 25340]],
      "prompt ids, seed 1")
check(compare.bench_prompt_ids(2, 1, 6, 50272) == [[22620, 47922, 38510, 16465, 40020, 12901]],
      "prompt ids, seed 2")

# sluice bench --json --policy auto: the measurement, the policy it ran and
# the search's one-line choice on stderr
r = compare.parse_sluice_bench(read("sluice-bench-auto.stdout"), read("sluice-bench-auto.stderr"))
raw = json.loads(read("sluice-bench-auto.stdout").strip().splitlines()[-1])
check(r is not None and r["throughput_tok_s"] == raw["throughput_tok_s"], "sluice bench: tokens/s")
check(r["prefill_s"] == raw["prefill_s"] and r["decode_s"] == raw["decode_s"], "sluice bench: times")
check(r["peak_bytes"] == raw["peak_bytes"], "sluice bench: peak bytes per tier")
want = (f"{raw['gpu_batch_size']}x{raw['num_gpu_batches']} --percent "
        + " ".join(f"{raw[k]:g}" for k in ("w_gpu_percent", "w_cpu_percent", "cache_gpu_percent",
                                           "cache_cpu_percent", "act_gpu_percent", "act_cpu_percent")))
check(r["policy"].startswith(want), f"sluice bench: policy {r['policy']!r}, want {want!r}...")
check(r.get("auto_choice", "").startswith("--gpu-batch-size"), f"sluice bench: auto choice {r.get('auto_choice')}")
check(compare.parse_sluice_bench("sluice: --gpu-mem 1M is too small\n", "") is None, "sluice bench: no JSON")
check(compare.parse_sluice_bench('{"system": "sluice"}\n', "") is None, "sluice bench: JSON without tokens/s")

# sluice generate's output
g = compare.parse_sluice_generate(read("sluice-generate.jsonl"))
lines = [json.loads(l) for l in read("sluice-generate.jsonl").splitlines() if l.strip()]
check(sorted(g) == sorted(str(l["id"]) for l in lines), "generate: every id")
check(all(g[str(l["id"])][0] == l["output_ids"] for l in lines), "generate: output ids")
try:
    compare.parse_sluice_generate('{"id": "3", "error": "bad line"}\n')
    check(False, "generate: an error line accepted")
except ValueError as e:
    check("line 1" in str(e), f"generate: error line: {e}")

# the Accelerate worker's line, and its tokens against sluice's
w = compare.parse_worker(read("worker-accelerate.stdout"))
check(w is not None and w["throughput_tok_s"] > 0 and w["system"] == "accelerate", "worker: parsed")
check(len(w["output_ids"]) == len(lines) and all(len(x) == len(w["output_ids"][0]) for x in w["output_ids"]),
      "worker: one row of tokens per prompt")
same = [compare.agreement(g[str(i)], w["output_ids"][i]) for i in range(len(w["output_ids"]))]
check(all(s is not None for s in same), "worker: every sequence compared")
check(compare.parse_worker("Traceback ...\nRuntimeError: x\n") is None, "worker: a crash")
# agreement: EOS ends sluice's sequence (kept); HF's EOS is masked
check(compare.agreement(([5, 6, 7], "length"), [5, 6, 7]) is True, "agree: equal")
check(compare.agreement(([5, 6, 7], "length"), [5, 6, 8]) is False, "agree: last token differs")
check(compare.agreement(([5, 2], "stop"), [5, 9, 9]) is True, "agree: up to sluice's EOS")
check(compare.agreement(([5, 2], "stop"), [4, 9, 9]) is False, "agree: differs before EOS")
check(compare.agreement(([2], "stop"), [4, 9]) is None, "agree: nothing before EOS")

# FlexGen's benchmark log (the format of flex_opt.py's write_benchmark_log;
# the numbers of this sample are made up, no FlexGen ran here)
f = compare.parse_flexgen_log(read("flexgen.log"))
check(f == {"prefill_s": 1.5, "decode_s": 4.25, "total_s": 5.75, "throughput_tok_s": 44.522,
            "peak_gpu_gb": 7.125, "model_gb": 2.443, "cache_gb": 1.0, "projected": False}, f"flexgen: {f}")
check(compare.parse_flexgen_log("CUDA out of memory\n") is None, "flexgen: a failure")

# the report writer on made-up runs with known numbers
tmp = tempfile.mkdtemp()
try:
    mach = {"type": "machine", "date_utc": "20260101-000000", "t_start": 0.0,
            "machine": {"cpu_model": "Test CPU", "logical_cpus": 2, "mem_total_gib": 8.0, "gpu": "none",
                        "disk_device": "/dev/x", "disk_free_gib": 10.0},
            "versions": {"sluice": "sluice 1.0", "git": "abc", "torch": "2", "transformers": "5",
                         "accelerate": "1", "flexgen": None, "cuda": False},
            "loadavg_start": [0.5, 0.4, 0.3], "nice": 0, "argv": ["bench/compare.py", "--quick"],
            "grid": {"opt-125m": {"budgets": ["host:gpu=96M", "disk:gpu=96M,cpu=64M", "ram:gpu=96M,cpu=64M,ram=1G",
                                              "probed:gpu=96M,cpu=64M"],
                                  "batches": [4]}},
            "prompt_len": 64, "gen_len": 16, "repeat": 3, "hf_dtype": "fp32", "systems": list(compare.SYSTEMS)}

    def run(system, budget, tput, rep, ok=True, agree=None, extra=None):
        res = {"throughput_tok_s": tput, "prefill_s": 1.0, "decode_s": 2.0, "batch": 4}
        res.update(extra or {})
        d = {"type": "run", "system": system, "model": "opt-125m", "budget": budget, "batch": 4,
             "repeat_idx": rep, "cmd": f"{system} --rep {rep}", "rc": 0 if ok else 1, "ok": ok,
             "result": res if ok else None, "peak_rss_bytes": 300 << 20, "os_write_bytes": 10 << 20,
             "os_read_bytes": 5 << 20, "loadavg_start": [1.0, 1, 1]}
        if agree:
            d["agree"] = agree
        if not ok:
            d["stderr_tail"] = "sluice: out of memory (made up)"
        return d

    recs = [mach]
    pol = {"gpu_batch_size": 4, "num_gpu_batches": 1, "policy": "4x1 --percent 0 100 0 100 0 100",
           "peak_bytes": {"device": 50 << 20, "host": 200 << 20, "disk": 0}}
    for rep, (a_, f_, c_, t_) in enumerate([(10, 8, 4, 20), (12, 9, 5, 21), (11, 7, 6, 19)], 1):
        recs.append(run("sluice-auto", "host", a_, rep, extra=pol))
        recs.append(run("sluice-flexgen", "host", f_, rep, extra=pol))
        recs.append(run("accelerate", "host", c_, rep, agree={"same": 3, "n": 4},
                        extra={"device_map_bytes": {"cpu": 250 << 20}, "max_memory": None}))
        recs.append(run("transformers", None, t_, rep, agree={"same": 4, "n": 4}))
        recs.append(run("accelerate", "disk", 2, rep, agree={"same": 4, "n": 4},
                        extra={"max_memory": {"cpu": 160 << 20},
                               "device_map_bytes": {"cpu": 40 << 20, "disk": 120 << 20},
                               "offload_folder_bytes": 0}))
    recs.append(run("sluice-auto", "disk", 0, 1, ok=False))
    # under a RAM cap: the cgroup's peak and the block-layer reads; a run
    # the cap killed says so
    for rep in (1, 2):
        r_ = run("accelerate", "ram", 1.5, rep, extra={"max_memory": {"cpu": 160 << 20}})
        r_.update(ram_cap_bytes=1 << 30, cgroup_peak_bytes=(900 + rep) << 20, os_read_bytes=(400 + rep) << 20)
        recs.append(r_)
    r_ = run("sluice-auto", "ram", 0, 1, ok=False)
    r_.update(ram_cap_bytes=1 << 30, cgroup_oom_kills=1, rc=137)
    recs.append(r_)
    # the disk's rate around each run: tokens/s over it, and the ratio so
    # measured (sluice 6 at 2.0 GB/s, 3 per GB/s; Accelerate 2 at 1.0, 1.5
    # at 0.5: 2 and 3 per GB/s, median 2.5: 1.2x, where the plain ratio of
    # medians is 6 / 1.75)
    for rep, (sg, ag, at) in enumerate([((1.9, 2.1), (1.0, 1.0), 2.0), ((2.0, None), (0.4, 0.6), 1.5)], 1):
        r_ = run("sluice-auto", "probed", 6.0, rep, extra=pol)
        r_["disk_probe_gbps"] = list(sg)
        recs.append(r_)
        r_ = run("accelerate", "probed", at, rep, extra={"max_memory": {"cpu": 160 << 20}})
        r_["disk_probe_gbps"] = list(ag)
        recs.append(r_)
    recs.append({"type": "skip", "system": "sluice-flexgen", "model": "opt-125m", "budget": "disk", "batch": 4,
                 "reason": "no FlexGen-style policy fits (22 tried)"})
    jl = os.path.join(tmp, "compare-x.jsonl")
    with open(jl, "w") as fh:
        for x in recs:
            fh.write(json.dumps(x) + "\n")
    md = compare.report(jl, plots=False)
    text = open(md).read()

    def has(s, what):
        check(s in text, f"report: {what}: '{s}' not in the report")

    has("| opt-125m | host | 4 | sluice-auto | 11.00 | 1.000 | 2.000 | 300 | n/a | 0 | 5 | (itself) | "
        "4x1 --percent 0 100 0 100 0 100 peak 50/200/0 MiB dev/host/disk | 1.0 |", "the sluice-auto row (median 11)")
    has("| opt-125m | host | 4 | accelerate | 5.00 | 1.000 | 2.000 | 300 | n/a | 0 | 5 | 9/12 | cpu 250 MiB | 1.0 |",
        "the accelerate row (median 5, 9 of 12 the same)")
    # on disk: Accelerate's device map's disk share, read from the checkpoint
    has("| opt-125m | disk | 4 | accelerate | 2.00 | 1.000 | 2.000 | 300 | n/a | 120 | 5 | 12/12 | cpu 40 MiB, disk 120 MiB |",
        "the accelerate row with weights on disk (its device map's disk bytes)")
    has("| opt-125m | all in RAM | 4 | transformers | 20.00 |", "the transformers row")
    has("| opt-125m | disk | 4 | sluice-auto | n/a (0/1 ok) |", "a cell whose runs all failed")
    # ratios of the medians: 11 / 8, 11 / 5, 11 / 20
    has("| opt-125m | host | 4 | 1.38 | 2.20 | 0.55 |", "the ratios")
    has("| opt-125m | host | --gpu-mem 96M, the rest on disk | none (all in RAM), the rest in its offload folder |",
        "the host budget, Accelerate uncapped")
    has("| opt-125m | disk | --gpu-mem 96M --cpu-mem 64M, the rest on disk | cpu: 160M,", "the disk budget")
    has("- sluice-flexgen opt-125m disk batch 4: no FlexGen-style policy fits (22 tried)", "the skipped cell")
    has("- sluice-auto opt-125m disk batch 4 rep 1: rc 1: sluice: out of memory (made up)", "the failed run")
    has("| FlexGen | opt-30b | 7.32 | 144 | CPU |", "FlexGen's published numbers, without FlexGen here")
    has("**published**", "the published numbers labelled")
    has("- sluice-auto: `sluice-auto --rep 1`", "the first command of each system")
    has("(the run did not finish)", "no end record")
    has("| opt-125m | ram | 4 | accelerate | 1.50 | 1.000 | 2.000 | 300 | 902 | 0 | 402 |", "a run under a RAM cap")
    has("| opt-125m | ram | --gpu-mem 96M --cpu-mem 64M, the rest on disk | cpu: 160M, the rest in its offload "
        "folder | 1G |", "the RAM cap in the budgets")
    has("- sluice-auto opt-125m ram batch 4 rep 1: rc 137: killed at the RAM cap (1G); ", "a run the cap killed")
    has("| opt-125m | probed | 4 | sluice-auto | 2.00 | 3.00 | - |", "sluice's disk rate around its runs")
    has("| opt-125m | probed | 4 | accelerate | 0.75 | 2.50 | 1.20 |",
        "Accelerate's disk rate, and the ratio per disk GB/s")
    check("## The disk's rate around each run" in text, "the disk probe section")
    sums = [json.loads(l) for l in open(jl) if '"summary"' in l]
    s = next(x for x in sums if x["system"] == "sluice-auto" and x["budget"] == "host")
    check(s["tok_s_runs"] == [10, 12, 11] and s["throughput_tok_s"] == statistics.median([10, 12, 11]),
          f"summary record {s}")
    check(abs(s["ratios"]["accelerate"] - 2.2) < 1e-9, f"ratio {s['ratios']}")
    # remaking the report replaces the summaries, not adds to them
    compare.report(jl, plots=False)
    check(sum(1 for l in open(jl) if '"summary"' in l) == len(sums), "report twice: the summaries once")

    # a recorded --quick run's results: the report again, with plots where
    # matplotlib is here
    shutil.copy(os.path.join(fx, "quick-results.jsonl"), os.path.join(tmp, "compare-q.jsonl"))
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
        print("test_compare: matplotlib is not installed: the plots are not checked")
    md = compare.report(os.path.join(tmp, "compare-q.jsonl"), plots=have_mpl)
    text = open(md).read()
    runs = [json.loads(l) for l in open(os.path.join(fx, "quick-results.jsonl"))]
    runs = [x for x in runs if x.get("type") == "run" and x["ok"]]
    for system in ("sluice-auto", "sluice-flexgen", "accelerate", "transformers"):
        tputs = [x["result"]["throughput_tok_s"] for x in runs if x["system"] == system]
        check(tputs and f"| {system} | {statistics.median(tputs):.2f} |" in text,
              f"recorded run: the {system} row")
    if have_mpl:
        for name in ("budget", "batch", "bars"):
            for ext in ("png", "svg"):
                p = os.path.join(tmp, f"compare-q-{name}.{ext}")
                check(os.path.exists(p) and os.path.getsize(p) > 1000, f"plot {p}")
        has_plot = "![tokens/s against the memory budget](compare-q-budget.png)" in text
        check(has_plot, "the report shows the plots")

    # the probe itself: a rate, the file kept for the next probe (where the
    # file system takes O_DIRECT; tmpfs does not, and the probe says None)
    pdir = os.path.join(root, "build", "test-compare-probe") if os.path.isdir(os.path.join(root, "build")) else tmp
    os.makedirs(pdir, exist_ok=True)
    g = compare.disk_probe(pdir, 8 << 20, req=1 << 20)
    if g is None:
        print(f"test_compare: {pdir} refuses O_DIRECT: the disk probe is not checked")
    else:
        check(g > 0 and os.path.getsize(os.path.join(pdir, "disk-probe.bin")) == 8 << 20, f"disk probe {g}")
        check(compare.disk_probe(pdir, 8 << 20, req=1 << 20) > 0, "a second probe of the kept file")
    shutil.rmtree(pdir, ignore_errors=True) if pdir != tmp else None

    # bad input: one line naming what is wrong, exit 2, nothing written
    def cli(*args):
        return subprocess.run([sys.executable, os.path.join(root, "bench", "compare.py"), "--outdir", tmp,
                               "--sluice", "/bin/true", *args], capture_output=True, text=True)
    for args, msg in (((" --budget", "x"), "budget 'x': want NAME:gpu=SIZE"),
                      (("--models", "opt-7b"), "unknown model 'opt-7b'"),
                      (("--batches", "0"), "batches must be >= 1"),
                      (("--systems", "sluice-auto,vllm"), "unknown system(s) ['vllm']"),
                      (("--budget", "a:gpu=1G", "--budget", "a:gpu=2G"), "budget names must differ"),
                      (("--report", os.path.join(tmp, "none.jsonl")), "none.jsonl: no such file")):
        args = tuple(x.strip() for x in args)
        p = cli(*args)
        err = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(err) == 1 and msg in err[0], f"cli {args}: rc {p.returncode}, {p.stderr!r}")
    p = cli("--sluice", os.path.join(tmp, "no-sluice"))
    check(p.returncode == 2 and "no-sluice: not an executable" in p.stderr, f"cli no sluice: {p.stderr!r}")
    for args, msg in ((("--batches", "1,maxx"), "batches must be integers or 'max'"),
                      (("--batches", "max", "--max-batch", "0"), "max-batch must be an integer >= 1")):
        p = cli(*args)
        check(p.returncode == 2 and msg in p.stderr, f"cli {args}: rc {p.returncode}, {p.stderr!r}")

    # --batches with 'max': the grid keeps it last; the harness resolves it
    # per budget by bisection over sluice policy's answers (a stand-in
    # sluice here: a block of up to FIT sequences fits, more does not)
    ns = dict(config=None, quick=False, prompt_len=None, gen_len=None, repeat=None, models="opt-125m",
              budget=["host:gpu=96M", "disk:gpu=96M,cpu=64M"], batches="8,max,1,8", max_batch=64)
    g = compare.build_grid(type("A", (), ns)())
    check(g["opt-125m"]["batches"] == [1, 8, "max"], f"grid batches {g['opt-125m']['batches']}")
    fake = os.path.join(tmp, "fake-sluice")
    with open(fake, "w") as fh:
        fh.write("#!/bin/sh\n"
                 "for x in \"$@\"; do case $x in gpu_batch_size=*) b=${x#gpu_batch_size=};; esac; done\n"
                 "[ \"$FIT\" = fail ] && { echo 'sluice policy: the profile is corrupt' >&2; exit 1; }\n"
                 "[ \"$b\" -le \"$FIT\" ] && exit 0\n"
                 "echo 'sluice policy: no policy fits the budgets: the host budget is too small' >&2\n"
                 "exit 2\n")
    os.chmod(fake, 0o755)
    ha = type("A", (), dict(ns, work=tmp, sluice=fake, python=sys.executable, quiet=True, backend="cpu",
                            prompt_len=64, gen_len=16, max_batch=64,
                            sluice_flags="--cpu-gemm bf16 --compress-weight"))()
    h = compare.Harness(ha, g)
    h.jsonl = os.path.join(tmp, "largest.jsonl")
    h.profile = os.path.join(tmp, "profile.json")
    bud = compare.parse_budget("disk:gpu=96M,cpu=64M")
    for fit, want in (("23", 23), ("64", 64), ("1000", 64), ("1", 1), ("0", None), ("fail", None)):
        os.environ["FIT"] = fit
        got = h.largest_batch("opt-125m", tmp, bud)
        rec = h.recs[-1] if h.recs[-1]["type"] == "largest_batch" else h.recs[-2]
        check(got == want, f"largest batch with {fit} fitting: {got}, want {want}")
        if fit == "23":
            check(len(rec["probes"]) <= 8 and "--fix gpu_batch_size=B" in rec["cmd"] and "--cpu-mem 64M" in rec["cmd"]
                  and "--fix compress_weight=true" in rec["cmd"] and "--cpu-gemm bf16" in rec["cmd"],
                  f"largest batch probes {rec}")
        if fit == "fail":
            check("the profile is corrupt" in rec.get("error", ""), f"a failing sluice policy: {rec}")
        if want is None:
            check(h.recs[-1]["type"] == "skip" and h.recs[-1]["batch"] == "max", f"skip recorded: {h.recs[-1]}")
    del os.environ["FIT"]
    # --sluice-flags that change the job's bytes reach the probes; the rest not
    got = compare.policy_memory_flags("--cpu-gemm bf16 --compress-weight --kv-dtype f32 --hh-ratio=0.2 --threads 2 "
                                      "--recent-ratio 0.1 --cpu-cache-compute")
    check(got == ["--fix", "compress_weight=true", "--kv-dtype", "f32", "--fix", "hh_ratio=0.2",
                  "--fix", "recent_ratio=0.1", "--fix", "cpu_cache_compute=true"], f"policy flags {got}")
    check(compare.policy_memory_flags(None) == [], "no flags")
    check(compare.cpu_gemm_flags("--threads 2 --cpu-gemm bf16") == ["--cpu-gemm", "bf16"], "--cpu-gemm")
    check(compare.cpu_gemm_flags("--cpu-gemm=amx") == ["--cpu-gemm", "amx"], "--cpu-gemm=")
    check(compare.cpu_gemm_flags("--compress-weight") == [], "no --cpu-gemm")
    # the report: the largest batch's table and the rows run at it
    recs2 = [mach, {"type": "largest_batch", "model": "opt-125m", "budget": "disk", "cap": 64, "batch": 23,
                    "capped": False, "probes": [{"batch": b, "rc": 0} for b in range(7)], "cmd": "sluice policy ..."},
             {"type": "largest_batch", "model": "opt-125m", "budget": "host", "cap": 64, "batch": 64,
              "capped": True, "probes": [{"batch": 64, "rc": 0}], "cmd": "sluice policy ..."}]
    for rep in (1, 2, 3):
        r1 = run("sluice-auto", "disk", 7, rep)
        r1["batch"] = 23
        recs2.append(r1)
    jl2 = os.path.join(tmp, "compare-max.jsonl")
    with open(jl2, "w") as fh:
        for x in recs2:
            fh.write(json.dumps(x) + "\n")
    text = open(compare.report(jl2, plots=False)).read()
    has("| opt-125m | disk | 23 | 7 |", "the largest batch's row")
    has("| opt-125m | host | 64 (the cap) | 1 |", "a capped largest batch")
    has("| opt-125m | disk | 23 (largest) | sluice-auto | 7.00 |", "a run at the largest batch, marked")
finally:
    shutil.rmtree(tmp)

print(f"test_compare: {passes} passed, {fails} failed")
sys.exit(1 if fails else 0)
