#!/usr/bin/env python3
"""sluice against Hugging Face Accelerate, plain transformers and FlexGen on
the same machine, checkpoint, prompts and memory budget (issue 16).

One command runs, for every (model, budget, batch) of its grid and one
after another, each system on the same fp16 safetensors checkpoint and the
same prompt token ids:

  sluice-auto     sluice bench --policy auto under the budget (the search's
                  choice; it may run a smaller block than the batch asked:
                  the batch it ran is recorded and used)
  sluice-flexgen  sluice bench with the policy a FlexGen user writes for the
                  budget: FlexGen's published OPT-30B/175B shape (as many
                  weights on the device as fit, in steps of 10%, then on the
                  host, the rest on disk; the cache and activations on the
                  host, CPU attention, several micro-batches), the first
                  such policy sluice admits under the budget
  accelerate      transformers from_pretrained(dir, device_map="auto",
                  max_memory={...}, offload_folder=...) and model.generate
                  (greedy, the same ids, min_new_tokens = max_new_tokens)
  transformers    from_pretrained(dir) with everything in memory, where the
                  weights fit in the memory available (the unconstrained
                  reference; once per batch, not per budget)
  flexgen         python -m flexgen.flex_opt where a CUDA GPU and the
                  flexgen package are present; elsewhere FlexGen's published
                  T4 numbers go into the report, labelled "published"

Every system's tokens/s is FlexGen's metric, batch x new tokens / (prefill +
decode), a warm-up excluded (sluice bench's own; the Hugging Face workers
generate 2 tokens from 8-token prompts first, as bench/hf_cpu_bench.py).
Each run is a process of its own: its peak RSS and the bytes it read and
wrote through the block layer come from wait4(2); sluice adds its own peak
bytes per tier. The greedy tokens of the Hugging Face runs are compared
with sluice generate's on the same prompts (sluice's tokens do not depend
on the placement or the batch, which its tests check): the share of
identical sequences is reported.

Batches. --batches takes sizes and 'max': per budget, the largest batch up
to --max-batch (64) for which sluice's search (sluice policy, the block one
micro-batch) finds a policy that fits the budget, found by bisection and
recorded as a "largest_batch" line; every system then runs that batch.
Accelerate has no such limit of its own (max_memory bounds its weights).

Budgets. "gpu" is sluice's --gpu-mem (on the CPU backend: the device
arena, in RAM), "cpu" its --cpu-mem (the host tier; absent: uncapped), the
disk the work folder. Accelerate on a CPU-only machine has one memory tier,
"cpu", and the disk: it gets max_memory={"cpu": gpu + cpu}, the whole RAM
sluice may use, and its offload folder for the rest; with the host
uncapped it gets no max_memory (all in RAM, as sluice may keep all in RAM).
Where CUDA is present, Accelerate gets {0: gpu, "cpu": cpu}. A budget's
"ram" (e.g. disk:gpu=2G,cpu=6G,ram=10G) runs every system's process in a
memory cgroup of that limit, RSS and page cache together, as on a machine
with that much RAM, the run's files dropped from the page cache first
(RamCap below): without it Accelerate, which reads offloaded weights
through the page cache, reads them from spare RAM.
The disk. Before and after each run of a budget with a disk tier (a "cpu"
cap) the harness reads 1 GiB (--disk-probe) of a file in the work folder
with O_DIRECT and records the rate; the report gives each cell's rate and
tokens/s over it. The probe takes about a second: beside a run of minutes
it samples the disk, a check on a disk-bound ratio, not a correction of it
(on this project's VM it read 0.47 to 3.05 GB/s around one cell's runs).

Set-up (nothing in the C build depends on it):
  tools/compare-venv.sh /work/venv-cmp     # torch (CPU), transformers,
                                           # accelerate, matplotlib
  /work/venv-cmp/bin/python bench/compare.py --quick
  /work/venv-cmp/bin/python bench/compare.py --models opt-125m,opt-1.3b

Output: bench/results/compare-<UTC>.jsonl (machine, versions, every run with
its exact command, summaries), .md (tables, ratios, commands, notes) and
compare-<UTC>-{budget,batch,bars}.{png,svg} (matplotlib; without it the
report says so and writes no plot). --report FILE.jsonl remakes the .md and
plots from a .jsonl.

Exit status: 0 done (failed runs are recorded, the grid goes on); 2 bad
arguments or configuration; 1 nothing could be run.
"""

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hf_cpu_bench as hfb  # noqa: E402  (stdlib only at import)

SYSTEMS = ("sluice-auto", "sluice-flexgen", "accelerate", "transformers", "flexgen")
EOS = 2
# defaults per model: budgets that put weights on the host (the device
# arena too small for them) and on the disk (the host capped too), batches
DEFAULTS = {
    "opt-125m": {"budgets": ["host:gpu=96M", "disk:gpu=96M,cpu=64M"], "batches": [1, 8, 32]},
    "opt-1.3b": {"budgets": ["host:gpu=640M", "disk:gpu=640M,cpu=1G"], "batches": [1, 8]},
    "opt-2.7b": {"budgets": ["host:gpu=1G", "disk:gpu=1G,cpu=2G"], "batches": [1, 8]},
    "opt-6.7b": {"budgets": ["host:gpu=2G", "disk:gpu=2G,cpu=6G"], "batches": [1, 4]},
}
QUICK = {"models": ["opt-125m"], "budgets": ["disk:gpu=96M,cpu=64M"], "batches": [4],
         "prompt_len": 64, "gen_len": 16, "repeat": 1}

# FlexGen's published numbers (FlexGen README and benchmark/batch_size_table.md;
# GCP T4 16 GB, 208 GB DRAM, 1.5 TB NVMe; prompt 512, 32 new tokens), as
# /work/shared/reference/flexgen.md section 7 lists them: system, model,
# tok/s, effective batch, lowest tier
PUBLISHED = [
    ("FlexGen", "opt-6.7b", 25.26, 2, "GPU"), ("FlexGen", "opt-30b", 7.32, 144, "CPU"),
    ("FlexGen", "opt-175b", 0.69, 256, "disk"),
    ("FlexGen (c)", "opt-6.7b", 29.12, 72, "GPU"), ("FlexGen (c)", "opt-30b", 8.38, 512, "CPU"),
    ("FlexGen (c)", "opt-175b", 1.12, 144, "CPU"),
    ("HF Accelerate", "opt-6.7b", 25.12, 2, "GPU"), ("HF Accelerate", "opt-30b", 0.62, 8, "CPU"),
    ("HF Accelerate", "opt-175b", 0.01, 2, "disk"),
]


class ConfigError(Exception):
    pass


def cpu_gemm_flags(sluice_flags):
    """--sluice-flags' --cpu-gemm, as ["--cpu-gemm", NAME], or []."""
    args = shlex.split(sluice_flags or "")
    for i, x in enumerate(args):
        if x.startswith("--cpu-gemm="):
            return ["--cpu-gemm", x.split("=", 1)[1]]
        if x == "--cpu-gemm" and i + 1 < len(args):
            return ["--cpu-gemm", args[i + 1]]
    return []


def policy_memory_flags(sluice_flags):
    """What of --sluice-flags changes a job's bytes, as sluice policy takes
    it: the 4-bit weights and cache, cpu_cache_compute and an H2O budget
    pinned with --fix, the cache's dtype as it is. The others (--cpu-gemm,
    --threads) move no byte."""
    args, out, i = shlex.split(sluice_flags or ""), [], 0
    switches = ("--compress-weight", "--compress-cache", "--cpu-cache-compute")
    valued = ("--kv-dtype", "--hh-ratio", "--recent-ratio")
    while i < len(args):
        x, val = args[i], None
        if "=" in x and x.split("=", 1)[0] in valued:
            x, val = x.split("=", 1)
        elif x in valued and i + 1 < len(args):
            val = args[i + 1]
            i += 1
        field = x[2:].replace("-", "_")
        if x in switches:
            out += ["--fix", field + "=true"]
        elif x == "--kv-dtype" and val is not None:
            out += [x, val]
        elif x in valued and val is not None:
            out += ["--fix", f"{field}={val}"]
        i += 1
    return out


# ---- sizes, budgets, prompts ---------------------------------------------

def parse_size(s):
    """'96M' -> bytes, as sluice reads a size (K, M, G, T: powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\s*", str(s), re.I)
    if not m:
        raise ConfigError(f"'{s}' is not a size (e.g. 512M, 2G)")
    v = float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())
    if v <= 0:
        raise ConfigError(f"size '{s}' must be above 0")
    return int(v)


def probe_size(s):
    """--disk-probe's SIZE: a size, or 0 (no probe)."""
    if str(s).strip() == "0":
        return 0
    try:
        return parse_size(s)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e))


def fmt_size(n):
    if n is None:
        return "uncapped"
    for u, p in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 2 ** p and n % 2 ** (p - 10) == 0:
            return f"{n / 2 ** p:g}{u}"
    return str(n)


def parse_budget(spec):
    """'NAME:gpu=96M[,cpu=64M][,ram=8G]' -> {"name", "gpu", "cpu", "ram", "spec"}.
    ram: every system's process runs in a memory cgroup of that limit (its
    RSS and the page cache it fills together), as on a machine with that
    much RAM."""
    name, sep, rest = str(spec).partition(":")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError(f"budget '{spec}': want NAME:gpu=SIZE[,cpu=SIZE][,ram=SIZE]")
    b = {"name": name, "gpu": None, "cpu": None, "ram": None}
    for part in rest.split(","):
        k, eq, v = part.partition("=")
        k = k.strip()
        if not eq or k not in ("gpu", "cpu", "ram"):
            raise ConfigError(f"budget '{spec}': '{part}' is not gpu=SIZE, cpu=SIZE or ram=SIZE")
        b[k] = parse_size(v)
    if b["gpu"] is None:
        raise ConfigError(f"budget '{spec}': gpu=SIZE is required (sluice's --gpu-mem)")
    if b["ram"] is not None and b["ram"] < b["gpu"] + (b["cpu"] or 0):
        raise ConfigError(f"budget '{spec}': ram={fmt_size(b['ram'])} is below gpu + cpu, the memory the "
                          f"budget gives (leave room for each process's own memory too)")
    b["spec"] = spec
    return b


def bench_prompt_ids(seed, batch, plen, vocab):
    """The prompt ids sluice bench --seed SEED makes (tools/cmd_bench.c:
    xorshift64 from 0x2545f4914f6cdd1d * (seed + 1), each id 3 + x mod
    (vocab - 3)), batch rows of plen; a smaller batch's are the first rows."""
    m = (1 << 64) - 1
    x = (0x2545f4914f6cdd1d * (seed + 1)) & m
    out = []
    for _ in range(batch):
        row = []
        for _ in range(plen):
            x ^= (x << 13) & m
            x ^= x >> 7
            x ^= (x << 17) & m
            row.append(3 + x % (vocab - 3))
        out.append(row)
    return out


def weight_bytes(model, dtype_bytes=2):
    return hfb.n_params(model) * dtype_bytes


# ---- parsing each system's output ------------------------------------------

def last_json(text):
    """The last line of text that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
    return None


def parse_sluice_bench(stdout, stderr):
    """sluice bench --json: the measurement and the policy it ran."""
    j = last_json(stdout)
    if j is None or "throughput_tok_s" not in j:
        return None
    keys = ("throughput_tok_s", "prefill_s", "decode_s", "batch", "gpu_batch_size",
            "num_gpu_batches", "w_gpu_percent", "w_cpu_percent", "cache_gpu_percent",
            "cache_cpu_percent", "act_gpu_percent", "act_cpu_percent", "cpu_cache_compute",
            "compress_cache", "overlap", "hh_ratio", "disk_read_bytes", "disk_write_bytes",
            "threads", "version", "predicted_throughput_tok_s", "backend")
    r = {k: j.get(k) for k in keys}
    r["peak_bytes"] = j.get("peak_bytes")
    r["policy"] = policy_flags(j)
    m = re.search(r"^sluice: policy auto: (.*?): predicted", stderr or "", re.M)
    if m:
        r["auto_choice"] = m.group(1)
    return r


def policy_flags(j):
    """A sluice bench JSON's policy as the flags that give it."""
    try:
        f = (f"{j['gpu_batch_size']}x{j['num_gpu_batches']} --percent "
             + " ".join(f"{j[k]:g}" for k in ("w_gpu_percent", "w_cpu_percent", "cache_gpu_percent",
                                                "cache_cpu_percent", "act_gpu_percent",
                                                "act_cpu_percent")))
    except (KeyError, TypeError, ValueError):
        return None
    if j.get("cpu_cache_compute"):
        f += " --cpu-cache-compute"
    if j.get("compress_cache"):
        f += " --compress-cache"
    if j.get("overlap") is False:
        f += " --no-overlap"
    if j.get("hh_ratio"):
        f += f" --hh-ratio {j['hh_ratio']:g}"
    return f


def parse_sluice_generate(text):
    """sluice generate's output lines -> {id: (output_ids, finish_reason)}."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if "error" in d or "output_ids" not in d:
            raise ValueError(f"line {n}: no output_ids ({line[:80]})")
        out[str(d["id"])] = (list(d["output_ids"]), d.get("finish_reason"))
    return out


def parse_worker(stdout):
    """A Hugging Face worker's (this script's --worker) JSON line."""
    j = last_json(stdout)
    if j is None or "throughput_tok_s" not in j:
        return None
    return j


FLEXGEN_RE = {k: re.compile(p, re.I) for k, p in {
    "prefill_s": r"prefill latency:\s*([0-9.]+)\s*s",
    "decode_s": r"decode latency:\s*([0-9.]+)\s*s",
    "total_s": r"total latency:\s*([0-9.]+)\s*s",
    "throughput_tok_s": r"total throughput:\s*([0-9.]+)\s*token",
    "peak_gpu_gb": r"peak gpu mem:\s*([0-9.]+)\s*GB",
    "model_gb": r"model size:\s*([0-9.]+)\s*GB",
    "cache_gb": r"cache size:\s*([0-9.]+)\s*GB",
}.items()}


def parse_flexgen_log(text):
    """FlexGen's benchmark log (flex_opt.py's write_benchmark_log: 'prefill
    latency: X s\\tprefill throughput: Y token/s' and so on), the last entry."""
    r = {}
    for k, rx in FLEXGEN_RE.items():
        ms = rx.findall(text)
        if ms:
            r[k] = float(ms[-1])
    if "throughput_tok_s" not in r:
        return None
    r["projected"] = bool(re.search(r"projected:\s*True", text))
    return r


def agreement(ref, got, eos=EOS):
    """Whether HF's new tokens got equal sluice's (ref: (output_ids,
    finish_reason)). sluice generate stops at EOS (kept); HF ran with
    min_new_tokens, which masks EOS only: the tokens before sluice's EOS are
    compared. None when there is nothing to compare."""
    ids, reason = ref
    if reason == "stop" and ids and ids[-1] == eos:
        ids = ids[:-1]
        return got[:len(ids)] == ids if ids else None
    return list(got) == list(ids)


# ---- machine and versions ------------------------------------------------

def machine_info(work):
    info = {"hostname_kind": platform.machine(), "kernel": platform.release(), "logical_cpus": os.cpu_count()}
    try:
        lc = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20).stdout
        d = {}
        for line in lc.splitlines():
            k, _, v = line.partition(":")
            d[k.strip()] = v.strip()
        info["cpu_model"] = d.get("Model name")
        info["cores_per_socket"] = d.get("Core(s) per socket")
        info["sockets"] = d.get("Socket(s)")
        info["threads_per_core"] = d.get("Thread(s) per core")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                info["mem_total_gib"] = round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    try:
        du = shutil.disk_usage(work)
        info["disk_free_gib"] = round(du.free / 2 ** 30, 1)
        src = subprocess.run(["df", "--output=source", work], capture_output=True, text=True,
                             timeout=20).stdout.split()[-1]
        info["disk_device"] = src
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    gpu = None
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        gpu = r.stdout.strip() or None
    info["gpu"] = gpu or "none"
    return info


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


# ---- a RAM cap: one memory cgroup per run ------------------------------------
#
# A budget's ram=SIZE emulates a machine with that much RAM: the run's
# process goes into a fresh memory cgroup limited to SIZE, which charges its
# RSS and the page cache its reads and writes fill. Without it, a system
# that reads its offloaded weights through the page cache (Accelerate's
# safetensors and memmaps) reads them from RAM once the machine has spare
# memory, while sluice reads its disk tier with O_DIRECT. The files of the
# run are dropped from the page cache first (posix_fadvise DONTNEED), since
# pages cached before the cgroup existed are not charged to it.

def memory_cgroup_dir(proc_cgroup, mounts):
    """(version, folder) of the memory cgroup /proc/self/cgroup's text names,
    under the cgroup mounts of /proc/self/mounts' text; None if there is none."""
    v1 = v2 = None
    for line in mounts.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "cgroup" and "memory" in f[3].split(","):
            v1 = v1 or f[1]
        elif len(f) >= 3 and f[2] == "cgroup2":
            v2 = v2 or f[1]
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        ctrl, _, path = rest.partition(":")
        if v1 and "memory" in ctrl.split(","):
            return 1, v1.rstrip("/") + path.rstrip("/")
        if v2 and hid == "0" and ctrl == "":
            d = v2.rstrip("/") + path.rstrip("/")
            try:
                if "memory" in open(os.path.join(d, "cgroup.controllers")).read().split():
                    return 2, d
            except OSError:
                pass
    return None


class RamCap:
    """A memory cgroup of limit bytes for one process: enter() in the child
    (preexec_fn), usage() after it exits, close() to remove it."""

    def __init__(self, limit, tag):
        try:
            found = memory_cgroup_dir(open("/proc/self/cgroup").read(), open("/proc/self/mounts").read())
        except OSError:
            found = None
        if not found:
            raise ConfigError("ram=SIZE needs a memory cgroup (v1, or v2 with the memory controller); "
                              "this machine has none")
        self.v, parent = found
        self.dir = os.path.join(parent, f"sluice-compare-{os.getpid()}-{tag}")
        try:
            os.mkdir(self.dir)
            knob = "memory.limit_in_bytes" if self.v == 1 else "memory.max"
            with open(os.path.join(self.dir, knob), "w") as f:
                f.write(str(limit))
        except OSError as e:
            self.close()
            raise ConfigError(f"ram=SIZE: cannot make a memory cgroup in {parent}: {e.strerror} "
                              f"(it needs root, or a delegated cgroup)")
        self.procs = os.path.join(self.dir, "cgroup.procs")

    def enter(self):
        with open(self.procs, "w") as f:
            f.write(str(os.getpid()))

    def usage(self):
        """Peak bytes charged (RSS and page cache) and whether the limit
        killed the process (or, v1, was hit)."""
        def rd(name):
            try:
                return open(os.path.join(self.dir, name)).read()
            except OSError:
                return ""
        if self.v == 1:
            peak = rd("memory.max_usage_in_bytes").strip()
            oom = re.search(r"oom_kill (\d+)", rd("memory.oom_control"))
            return {"cgroup_peak_bytes": int(peak) if peak else None,
                    "cgroup_limit_hits": int(rd("memory.failcnt").strip() or 0),
                    "cgroup_oom_kills": int(oom.group(1)) if oom else None}
        peak = rd("memory.peak").strip()
        oom = re.search(r"oom_kill (\d+)", rd("memory.events"))
        return {"cgroup_peak_bytes": int(peak) if peak else None,
                "cgroup_oom_kills": int(oom.group(1)) if oom else None}

    def close(self):
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # the exited process is still leaving it


def disk_probe(folder, nbytes, req=4 << 20):
    """The disk's read rate now, GB/s: a file of nbytes in folder (written
    once with O_DIRECT and kept) read with O_DIRECT, req bytes a request,
    one at a time, past the page cache.  None where the file system refuses
    O_DIRECT (tmpfs) or the probe fails.  compare.py runs it before and
    after each run of a budget with a disk tier: on a disk whose rate moves
    from minute to minute, a disk-bound run's tokens/s is then read beside
    the rate it had."""
    import mmap
    path = os.path.join(folder, "disk-probe.bin")
    nbytes -= nbytes % req
    buf = mmap.mmap(-1, req)  # page aligned, as O_DIRECT wants
    try:
        if not os.path.exists(path) or os.path.getsize(path) != nbytes:
            buf.write(os.urandom(req))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            try:
                for off in range(0, nbytes, req):
                    os.pwritev(fd, [buf], off)
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n, t0 = 0, time.perf_counter()
            for off in range(0, nbytes, req):
                got = os.preadv(fd, [buf], off)
                if got <= 0:
                    break
                n += got
            dt = time.perf_counter() - t0
        finally:
            os.close(fd)
        return round(n / dt / 1e9, 3) if n == nbytes and dt > 0 else None
    except OSError:
        return None
    finally:
        buf.close()


def drop_page_cache(paths):
    """posix_fadvise(DONTNEED) every file under paths: their pages leave the
    page cache (clean ones; nothing here writes them). Returns the bytes."""
    n = 0
    for top in paths:
        for d, _, files in os.walk(top):
            for name in files:
                p = os.path.join(d, name)
                try:
                    fd = os.open(p, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += os.fstat(fd).st_size
                finally:
                    os.close(fd)
    return n


# ---- running a process -----------------------------------------------------

def run_proc(cmd, timeout, env=None, cap=None):
    """Run cmd (in cap's cgroup, a RamCap, if given); its stdout, stderr, rc,
    wall time and own rusage (wait4)."""
    import tempfile
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, preexec_fn=cap.enter if cap else None)
        deadline = t0 + timeout if timeout else None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if deadline and time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                status = None
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = 0  # reaped by wait4; keep Popen from waiting again
        fo.seek(0)
        fe.seek(0)
        out = fo.read().decode(errors="replace")
        err = fe.read().decode(errors="replace")
    if status is None:
        rc = 124
    elif os.WIFEXITED(status):
        rc = os.WEXITSTATUS(status)
    else:
        rc = 128 + os.WTERMSIG(status)
    return {"rc": rc, "stdout": out, "stderr": err, "wall_s": round(wall, 3),
            "peak_rss_bytes": ru.ru_maxrss * 1024, "os_read_bytes": ru.ru_inblock * 512,
            "os_write_bytes": ru.ru_oublock * 512}


def tail(s, n=6):
    return "\n".join(s.strip().splitlines()[-n:])


# ---- the Hugging Face worker (runs in the venv's python) --------------------

def worker_main(a):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    kw = {"dtype": dtype}
    if a.worker == "accelerate":
        mm = {}
        if torch.cuda.is_available() and a.max_gpu:
            mm[0] = a.max_gpu
        if a.max_cpu:
            mm["cpu"] = a.max_cpu
        kw.update(device_map="auto", offload_folder=a.offload_folder)
        if mm:
            kw["max_memory"] = mm
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, **kw).eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    dev = "cuda" if a.worker == "accelerate" and torch.cuda.is_available() else "cpu"
    ids = torch.tensor(bench_prompt_ids(a.seed, a.batch, a.prompt_len, vocab), device=dev)
    mask = torch.ones_like(ids)
    warm = ids[:, :min(8, a.prompt_len)]
    model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=2, min_new_tokens=2,
                   do_sample=False)
    clock = hfb.FirstTokenClock()
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=a.gen_len, min_new_tokens=a.gen_len,
                         do_sample=False, streamer=clock)
    t1 = time.perf_counter()
    cpu = time.process_time() - c0
    if tuple(out.shape) != (a.batch, a.prompt_len + a.gen_len):
        raise SystemExit(f"compare.py worker: generate returned shape {tuple(out.shape)}")
    new = out[:, a.prompt_len:].tolist()
    placed = {}
    dm = getattr(model, "hf_device_map", None)
    if dm:
        sizes = {}
        for name, p in model.named_parameters():
            sizes[name] = p.numel() * p.element_size()
        for mod, d in dm.items():
            b = sum(v for k, v in sizes.items() if k == mod or k.startswith(mod + ".") or mod == "")
            placed[str(d)] = placed.get(str(d), 0) + b
    res = {"system": a.worker, "prefill_s": clock.first_token_t - t0, "decode_s": t1 - clock.first_token_t,
           "throughput_tok_s": a.batch * a.gen_len / (t1 - t0), "batch": a.batch, "cpu_s": cpu,
           "load_s": load_s, "dtype": a.dtype, "threads": torch.get_num_threads(),
           "device_map_bytes": placed or None, "output_ids": new,
           "torch": torch.__version__, "transformers": transformers.__version__}
    if a.worker == "accelerate":
        import accelerate
        res["accelerate"] = accelerate.__version__
        res["max_memory"] = {str(k): v for k, v in kw.get("max_memory", {}).items()} or None
        res["offload_folder_bytes"] = dir_bytes(a.offload_folder)
    print(json.dumps(res))
    return 0


def dir_bytes(path):
    n = 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            try:
                n += os.path.getsize(os.path.join(dp, f))
            except OSError:
                pass
    return n


def write_checkpoint_main(a):
    """Write a dummy OPT checkpoint: the published shapes, transformers' own
    initialisation (seeded), fp16 safetensors and config.json."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers
    from transformers import OPTForCausalLM
    torch.manual_seed(a.seed)
    cfg = hfb.opt_config(a.write_checkpoint, "float16")
    tmp = a.model_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    writer = "save_pretrained"
    if a.stream:
        # one tensor at a time, as OPT's _init_weights draws them (normal
        # with init_std for matrices and embeddings, zero biases, unit
        # norms), into safetensors written by hand: memory for the largest
        # tensor, not the model (opt-6.7b's 13 GB on a 23 GiB machine)
        writer = "stream"
        with torch.device("meta"):
            shapes = {n: tuple(t.shape) for n, t in OPTForCausalLM(cfg).state_dict().items()}
        if cfg.tie_word_embeddings:
            shapes.pop("lm_head.weight", None)
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for n, s in shapes.items():
            nb = 2
            for d in s:
                nb *= d
            header[n] = {"dtype": "F16", "shape": list(s), "data_offsets": [off, off + nb]}
            off += nb
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        os.makedirs(tmp)
        cfg.save_pretrained(tmp)
        gen = torch.Generator().manual_seed(a.seed)
        with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
            f.write(len(hb).to_bytes(8, "little") + hb)
            for n, s in shapes.items():
                if "layer_norm" in n:
                    t = torch.ones(s) if n.endswith(".weight") else torch.zeros(s)
                elif n.endswith(".bias"):
                    t = torch.zeros(s)
                else:
                    t = torch.empty(s).normal_(0.0, cfg.init_std, generator=gen)
                f.write(t.to(torch.float16).numpy().tobytes())
    else:
        model = OPTForCausalLM(cfg).to(torch.float16).eval()
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size="100GB")
    with open(os.path.join(tmp, "compare-checkpoint.json"), "w") as f:
        json.dump({"model": a.write_checkpoint, "seed": a.seed, "dtype": "float16", "writer": writer,
                   "transformers": transformers.__version__, "torch": torch.__version__}, f)
    shutil.rmtree(a.model_dir, ignore_errors=True)
    os.rename(tmp, a.model_dir)
    return 0


# ---- the driver ------------------------------------------------------------

class Harness:
    def __init__(self, a, grid):
        self.a = a
        self.grid = grid
        self.py = a.python
        self.work = os.path.abspath(a.work)
        self.sluice = os.path.abspath(a.sluice)
        self.recs = []
        self.jsonl = None

    def emit(self, rec):
        self.recs.append(rec)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def log(self, msg):
        if not self.a.quiet:
            print(msg, file=sys.stderr, flush=True)

    def checkpoint(self, model):
        d = os.path.join(self.work, "ckpt", model)
        mark = os.path.join(d, "compare-checkpoint.json")
        if os.path.exists(mark):
            try:
                if json.load(open(mark)).get("seed") == self.a.ckpt_seed:
                    return d
            except ValueError:
                pass
        # transformers' own model and save_pretrained where the memory
        # allows (fp32 model, fp16 copy), else tensor by tensor
        need = weight_bytes(model) * 2.2
        avail = hfb.mem_available_bytes()
        stream = bool(avail and need > avail)
        self.log(f"writing the {model} checkpoint to {d}" + (" (a tensor at a time)" if stream else ""))
        cmd = [self.py, os.path.join(HERE, "compare.py"), "--write-checkpoint", model, "--model-dir", d,
               "--seed", str(self.a.ckpt_seed)] + (["--stream"] if stream else [])
        r = run_proc(cmd, 0)
        if r["rc"]:
            raise ConfigError(f"{model}: writing the checkpoint failed: {tail(r['stderr'], 3)}")
        return d

    def sluice_base(self, mdir, batch, budget):
        a = self.a
        cmd = [self.sluice, "bench", "--backend", a.backend, "--model", mdir, "--prompt-len",
               str(a.prompt_len), "--gen-len", str(a.gen_len), "--batch", str(batch),
               "--gpu-mem", fmt_size(budget["gpu"])]
        if budget["cpu"]:
            cmd += ["--cpu-mem", fmt_size(budget["cpu"])]
        cmd += ["--offload-dir", os.path.join(self.work, "offload"), "--profile", self.profile,
                "--seed", str(a.seed), "--json"]
        return cmd + shlex.split(a.sluice_flags or "")

    def flexgen_policy(self, mdir, batch, budget):
        """The FlexGen-style policy for the budget: the first one sluice
        admits, most weights on the device, then on the host (steps of 10%),
        the cache and activations on the host (on the disk where the host
        does not hold them), CPU attention, micro-batches of batch/4."""
        ngb = 4 if batch >= 4 and batch % 4 == 0 else 1
        tries = 0
        caches = [(0, 100), (0, 0)] if budget["cpu"] else [(0, 100)]
        for wg in range(100, -1, -10):
            wcs = range(100 - wg, -1, -10) if budget["cpu"] else [100 - wg]
            for wc in wcs:
                for cg, cc in caches:
                    flags = ["--gpu-batch-size", str(batch // ngb), "--num-gpu-batches", str(ngb),
                             "--percent", str(wg), str(wc), str(cg), str(cc), "0", "100"]
                    if cc:
                        flags.append("--cpu-cache-compute")
                    # a refusal (exit 2) comes before anything runs; an
                    # admitted probe runs one prefill of the same cache
                    # length (prompt + gen - 1 tokens, 1 new token), not
                    # the whole workload
                    probe = self.sluice_base(mdir, batch, budget) + flags
                    probe[probe.index("--prompt-len") + 1] = str(self.a.prompt_len + self.a.gen_len - 1)
                    probe[probe.index("--gen-len") + 1] = "1"
                    tries += 1
                    r = run_proc(probe, self.a.timeout)
                    if r["rc"] == 0:
                        return flags, tries
                    if r["rc"] != 2:
                        return None, f"probe {' '.join(flags)} failed (rc {r['rc']}): {tail(r['stderr'], 1)}"
        return None, f"no FlexGen-style policy fits ({tries} tried)"

    def run_one(self, system, model, mdir, budget, batch, rep, extra=None):
        a = self.a
        rec = {"type": "run", "system": system, "model": model, "budget": budget["name"] if budget else None,
               "budget_spec": budget["spec"] if budget else None, "batch": batch, "repeat_idx": rep,
               "prompt_len": a.prompt_len, "gen_len": a.gen_len}
        env = None
        if system.startswith("sluice"):
            cmd = self.sluice_base(mdir, batch, budget) + (["--policy", "auto"] if system == "sluice-auto" else extra)
        elif system in ("accelerate", "transformers"):
            cmd = [self.py, os.path.join(HERE, "compare.py"), "--worker", system, "--model-dir", mdir,
                   "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len), "--batch", str(batch),
                   "--seed", str(a.seed), "--dtype", a.hf_dtype]
            if system == "accelerate":
                fold = os.path.join(self.work, "accelerate-offload")
                shutil.rmtree(fold, ignore_errors=True)
                os.makedirs(fold)
                cmd += ["--offload-folder", fold]
                for k, v in self.accel_memory(budget).items():
                    cmd += [f"--max-{k}", str(v)]
        elif system == "flexgen":
            logf = os.path.join(self.work, "flexgen.log")
            if os.path.exists(logf):
                os.remove(logf)
            wg, wc = extra
            ngb = 4 if batch >= 4 and batch % 4 == 0 else 1
            cmd = [self.py, "-m", "flexgen.flex_opt", "--model", f"facebook/{model}", "--path", "_DUMMY_",
                   "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len),
                   "--gpu-batch-size", str(batch // ngb), "--num-gpu-batches", str(ngb),
                   "--percent", str(wg), str(wc), "0", "100", "0", "100", "--cpu-cache-compute",
                   "--offload-dir", os.path.join(self.work, "flexgen-offload"), "--log-file", logf]
        rec["cmd"] = " ".join(shlex.quote(c) for c in cmd)
        cap = None
        if budget and budget.get("ram"):
            # the checkpoint and sluice's store start on disk, not in RAM
            rec["ram_cap_bytes"] = budget["ram"]
            rec["page_cache_dropped_bytes"] = drop_page_cache([mdir, os.path.join(self.work, "offload")])
            cap = RamCap(budget["ram"], f"{system}-{rep}")
        probe = a.disk_probe if budget and budget["cpu"] else 0
        if probe:
            rec["disk_probe_gbps"] = [disk_probe(self.work, probe)]
        rec["loadavg_start"] = loadavg()
        try:
            r = run_proc(cmd, a.timeout, env, cap)
        finally:
            if cap:
                rec.update(cap.usage())
                cap.close()
        if probe:
            rec["disk_probe_gbps"].append(disk_probe(self.work, probe))
        rec["loadavg_end"] = loadavg()
        for k in ("rc", "wall_s", "peak_rss_bytes", "os_read_bytes", "os_write_bytes"):
            rec[k] = r[k]
        if system.startswith("sluice"):
            res = parse_sluice_bench(r["stdout"], r["stderr"])
        elif system == "flexgen":
            res = parse_flexgen_log(open(logf).read() if os.path.exists(logf) else r["stdout"])
        else:
            res = parse_worker(r["stdout"])
        rec["ok"] = r["rc"] == 0 and res is not None
        if res is not None and "output_ids" in res:
            ids = res.pop("output_ids")
            ref = self.ref.get(model)
            if ref:
                same = [agreement(ref[str(i)], ids[i]) for i in range(len(ids)) if str(i) in ref]
                same = [s for s in same if s is not None]
                rec["agree"] = {"same": sum(same), "n": len(same)}
        rec["result"] = res
        if not rec["ok"]:
            rec["stderr_tail"] = tail(r["stderr"])
            rec["stdout_tail"] = tail(r["stdout"], 3)
        self.emit(rec)
        tput = res.get("throughput_tok_s") if res else None
        self.log(f"  {system:15s} {model} {rec['budget'] or '-':6s} B={batch} rep {rep}: "
                 + (f"{tput:.2f} tok/s" if rec["ok"] else f"FAILED rc={r['rc']}: {tail(r['stderr'], 1)[:160]}")
                 + f" (load {rec['loadavg_start'][0] if rec['loadavg_start'] else '?'})")
        return rec

    def largest_batch(self, model, mdir, budget):
        """The largest batch, up to --max-batch, for which sluice's search
        (sluice policy, the block one micro-batch: --fix gpu_batch_size=B
        --fix num_gpu_batches=1) finds a policy that fits the budget, by
        bisection (what fits grows no smaller as the batch falls); None
        where not even 1 fits or the search fails. Recorded as a
        "largest_batch" line."""
        a = self.a
        out = os.path.join(self.work, "largest-batch-policy.json")

        def cmd(b):
            c = [self.sluice, "policy", "--backend", a.backend, "--model", mdir, "--prompt-len", str(a.prompt_len),
                 "--gen-len", str(a.gen_len), "--gpu-mem", fmt_size(budget["gpu"])]
            if budget["cpu"]:
                c += ["--cpu-mem", fmt_size(budget["cpu"])]
            return c + ["--offload-dir", os.path.join(self.work, "offload"), "--profile", self.profile,
                        "--fix", f"gpu_batch_size={b}", "--fix", "num_gpu_batches=1", "--out", out] + \
                policy_memory_flags(a.sluice_flags) + cpu_gemm_flags(a.sluice_flags)

        probes = []

        def fits(b):
            r = run_proc(cmd(b), 600)
            probes.append({"batch": b, "rc": r["rc"]})
            if r["rc"] == 0:
                return True
            if r["rc"] == 2 and "no policy fits the budgets" in r["stderr"]:
                return False
            raise ConfigError(f"sluice policy failed (rc {r['rc']}): {tail(r['stderr'], 1)}")

        rec = {"type": "largest_batch", "model": model, "budget": budget["name"], "cap": a.max_batch,
               "cmd": " ".join(shlex.quote(c) for c in cmd("B"))}
        try:
            if fits(a.max_batch):
                lo = a.max_batch
            elif a.max_batch == 1 or not fits(1):
                lo = None
            else:
                lo, hi = 1, a.max_batch  # lo fits, hi does not
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        except ConfigError as e:
            rec.update(batch=None, probes=probes, error=str(e))
            self.emit(rec)
            self.emit({"type": "skip", "system": "all", "model": model, "budget": budget["name"], "batch": "max",
                       "reason": str(e)})
            return None
        rec.update(batch=lo, capped=lo == a.max_batch, probes=probes)
        self.emit(rec)
        if lo is None:
            self.emit({"type": "skip", "system": "all", "model": model, "budget": budget["name"], "batch": "max",
                       "reason": "not even one sequence fits (sluice policy)"})
        self.log(f"  largest batch {model} {budget['name']}: "
                 + ("none fits" if lo is None else f"{lo}" + (" (the cap, --max-batch)" if lo == a.max_batch else "")))
        return lo

    def accel_memory(self, budget):
        """Accelerate's max_memory for a budget (see the header)."""
        if self.cuda:
            m = {"gpu": budget["gpu"]}
            if budget["cpu"]:
                m["cpu"] = budget["cpu"]
            return m
        return {"cpu": budget["gpu"] + budget["cpu"]} if budget["cpu"] else {}

    def reference_tokens(self, model, mdir, budget, batch):
        """sluice generate's greedy tokens for the first batch prompts."""
        a = self.a
        cfg = json.load(open(os.path.join(mdir, "config.json")))
        prompts = os.path.join(self.work, f"prompts-{model}.jsonl")
        out = os.path.join(self.work, f"ref-{model}.jsonl")
        with open(prompts, "w") as f:
            for i, row in enumerate(bench_prompt_ids(a.seed, batch, a.prompt_len, cfg["vocab_size"])):
                f.write(json.dumps({"id": str(i), "input_ids": row}) + "\n")
        cmd = [self.sluice, "generate", "--backend", a.backend, "--model", mdir, "--prompts", prompts,
               "--out", out, "--overwrite", "--max-new-tokens", str(a.gen_len), "--batch-size", str(batch),
               "--quiet"]
        # the default placement (all in memory): generate's block needs more
        # device memory than bench's smallest budgets give, and sluice's
        # tokens do not depend on the placement (its tests check it)
        r = run_proc(cmd, a.timeout)
        rec = {"type": "reference", "model": model, "budget": None, "batch": batch,
               "cmd": " ".join(shlex.quote(c) for c in cmd), "rc": r["rc"], "wall_s": r["wall_s"]}
        ref = None
        if r["rc"] == 0:
            ref = parse_sluice_generate(open(out).read())
            rec["n"] = len(ref)
            rec["ended_at_eos"] = sum(1 for v in ref.values() if v[1] == "stop")
        else:
            rec["stderr_tail"] = tail(r["stderr"])
        self.emit(rec)
        self.log(f"  reference tokens {model}: " + ("ok" if ref else f"FAILED: {tail(r['stderr'], 1)}"))
        return ref

    def versions(self):
        v = {"python": platform.python_version()}
        r = run_proc([self.sluice, "version"], 60)
        v["sluice"] = r["stdout"].strip().splitlines()[0] if r["rc"] == 0 and r["stdout"].strip() else None
        g = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        v["git"] = g.stdout.strip() or None
        d = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
        v["git_dirty"] = bool(d.stdout.strip())
        probe = ("import json, importlib\nv = {}\n"
                 "for m in ('torch', 'transformers', 'accelerate', 'flexgen', 'matplotlib'):\n"
                 "    try:\n        v[m] = getattr(importlib.import_module(m), '__version__', 'present')\n"
                 "    except Exception:\n        v[m] = None\n"
                 "try:\n    import torch\n    v['cuda'] = torch.cuda.is_available()\n"
                 "    v['torch_threads'] = torch.get_num_threads()\nexcept Exception:\n    v['cuda'] = False\n"
                 "print(json.dumps(v))")
        r = run_proc([self.py, "-c", probe], 300)
        v.update(last_json(r["stdout"]) or {})
        return v

    def run(self):
        a = self.a
        os.makedirs(a.outdir, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.jsonl = os.path.join(a.outdir, f"compare-{stamp}.jsonl")
        open(self.jsonl, "w").close()
        vers = self.versions()
        if not vers.get("torch") or not vers.get("transformers"):
            print(f"compare.py: {self.py} cannot import torch and transformers (see the header: "
                  f"tools/compare-venv.sh makes a virtualenv)", file=sys.stderr)
            os.remove(self.jsonl)
            return 2
        self.cuda = bool(vers.get("cuda")) and a.backend != "cpu"
        systems = [s for s in a.systems if s != "accelerate" or vers.get("accelerate")]
        self.emit({"type": "machine", "date_utc": stamp, "t_start": time.time(), "machine": machine_info(self.work),
                   "versions": vers, "loadavg_start": loadavg(), "nice": os.nice(0),
                   "argv": sys.argv, "grid": self.grid, "prompt_len": a.prompt_len, "gen_len": a.gen_len,
                   "repeat": a.repeat, "hf_dtype": a.hf_dtype, "systems": systems,
                   "skipped_systems": {s: "accelerate is not installed" for s in a.systems if s not in systems}})
        self.log(f"compare: writing {self.jsonl}")
        # one profile for every sluice run, kept per sluice build (and
        # quick or not): a profile another build measured, or a quick one,
        # is not the machine as this run's search and predictions need it
        build = re.search(r"\(([^;)]+)", vers.get("sluice") or "")
        tag = re.sub(r"[^A-Za-z0-9._-]", "_", build.group(1) if build else "unknown")
        # and per CPU GEMM: the profile's products are those of the runs'
        # --cpu-gemm (sluice refuses a profile of another)
        gemm = cpu_gemm_flags(a.sluice_flags)
        gtag = f"-{gemm[1]}" if gemm else ""
        self.profile = os.path.join(self.work, f"profile-{tag}{gtag}{'-quick' if a.quick else ''}.json")
        if not os.path.exists(self.profile):
            pcmd = [self.sluice, "profile", "--backend", a.backend, "--offload-dir",
                    os.path.join(self.work, "offload"), "--json", self.profile] + gemm + \
                (["--quick"] if a.quick else [])
            os.makedirs(os.path.join(self.work, "offload"), exist_ok=True)
            self.log("  " + " ".join(pcmd))
            r = run_proc(pcmd, 0)
            if r["rc"]:
                print(f"compare.py: sluice profile failed: {tail(r['stderr'], 2)}", file=sys.stderr)
                return 1
        self.emit({"type": "profile", "path": self.profile, "profile": json.load(open(self.profile))})
        self.ref = {}
        for model, spec in self.grid.items():
            mdir = self.checkpoint(model)
            budgets = [parse_budget(b) for b in spec["budgets"]]
            self.emit({"type": "checkpoint", "model": model, "dir": mdir,
                       "bytes": dir_bytes(mdir), "meta": json.load(open(os.path.join(mdir, "compare-checkpoint.json")))})
            # each batch's budgets ('max': the largest each budget fits)
            at = {}
            for x in spec["batches"]:
                for b in budgets:
                    n = x if x != "max" else self.largest_batch(model, mdir, b)
                    if n and b not in at.setdefault(n, []):
                        at[n].append(b)
            if not at:
                continue
            self.ref[model] = self.reference_tokens(model, mdir, budgets[0], max(at))
            hf_fits = weight_bytes(model, 4 if a.hf_dtype == "fp32" else 2) < 0.6 * (hfb.mem_available_bytes() or 0)
            for batch in sorted(at):
                cells = []  # (system, budget, extra)
                if "transformers" in systems:
                    if hf_fits:
                        cells.append(("transformers", None, None))
                    else:
                        self.emit({"type": "skip", "system": "transformers", "model": model, "batch": batch,
                                   "reason": "the weights do not fit in the memory available"})
                for b in at[batch]:
                    for s in systems:
                        if s in ("transformers",):
                            continue
                        if s == "sluice-flexgen":
                            flags, why = self.flexgen_policy(mdir, batch, b)
                            if flags is None:
                                self.emit({"type": "skip", "system": s, "model": model, "budget": b["name"],
                                           "batch": batch, "reason": why})
                                continue
                            cells.append((s, b, flags))
                        elif s == "flexgen":
                            if not (self.cuda and vers.get("flexgen")):
                                continue
                            cells.append((s, b, (0, 100)))
                        else:
                            cells.append((s, b, None))
                for rep in range(1, spec.get("repeat", a.repeat) + 1):
                    order = cells if rep % 2 else cells[::-1]
                    for s, b, extra in order:
                        self.run_one(s, model, mdir, b, batch, rep, extra)
        self.emit({"type": "end", "t_end": time.time(), "loadavg_end": loadavg()})
        md = report(self.jsonl)
        self.log(f"compare: wrote {self.jsonl} and {md}")
        return 0


# ---- the report -------------------------------------------------------------

def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def summarize(recs):
    """Per (model, budget, batch, system): medians over the repetitions."""
    runs = [r for r in recs if r.get("type") == "run"]
    cells = {}
    for r in runs:
        k = (r["model"], r["budget"], r["batch"], r["system"])
        cells.setdefault(k, []).append(r)
    out = []
    for (model, budget, batch, system), rs in cells.items():
        ok = [r for r in rs if r["ok"]]
        s = {"type": "summary", "model": model, "budget": budget, "budget_spec": rs[0].get("budget_spec"),
             "batch": batch, "system": system, "n_ok": len(ok), "n_runs": len(rs)}
        for k in ("throughput_tok_s", "prefill_s", "decode_s"):
            s[k] = med([r["result"].get(k) for r in ok])
        s["tok_s_runs"] = [round(r["result"]["throughput_tok_s"], 4) for r in ok]
        for k in ("peak_rss_bytes", "os_write_bytes", "os_read_bytes", "cgroup_peak_bytes"):
            s[k] = med([r.get(k) for r in ok])
        s["ram_cap_bytes"] = rs[0].get("ram_cap_bytes")
        # the disk's rate around each run (the mean of the probes before
        # and after it), and tokens/s over it
        pr = []
        for r in ok:
            probes = [g for g in r.get("disk_probe_gbps") or [] if g]
            if probes:
                pr.append((r, statistics.mean(probes)))
        if pr:
            s["disk_probe_gbps"] = med([g for _, g in pr])
            s["tok_s_per_probe_gbps"] = med([r["result"]["throughput_tok_s"] / g for r, g in pr])
        s["batch_run"] = med([r["result"].get("batch") for r in ok])
        pols = sorted({r["result"].get("policy") for r in ok if r["result"].get("policy")})
        if pols:
            s["policy"] = pols
        peaks = [r["result"].get("peak_bytes") for r in ok if r["result"].get("peak_bytes")]
        if peaks:
            s["peak_bytes"] = {t: med([p.get(t) for p in peaks]) for t in peaks[0]}
        dm = [r["result"].get("device_map_bytes") for r in ok if r["result"].get("device_map_bytes")]
        if dm:
            s["device_map_bytes"] = dm[0]
        # what each system keeps on disk for the job: sluice's disk-tier
        # peak (its store and cache pages), Accelerate's offload folder.
        # (The rusage writes are not comparable: sluice bench probes the
        # disk with 1 GiB of O_DIRECT writes, and Accelerate's buffered
        # writes may not reach the block layer before it exits.)
        s["disk_bytes"] = (s.get("peak_bytes") or {}).get("disk")
        if s["disk_bytes"] is None and s["system"] == "accelerate":
            # the weights its device map puts on "disk": it reads them from
            # the checkpoint's safetensors in place (or from the offload
            # folder, where it had to copy them)
            s["disk_bytes"] = max(med([r["result"].get("offload_folder_bytes") for r in ok]) or 0,
                                  (s.get("device_map_bytes") or {}).get("disk") or 0)
        ag = [r["agree"] for r in ok if r.get("agree")]
        if ag:
            s["agree"] = {"same": sum(x["same"] for x in ag), "n": sum(x["n"] for x in ag)}
        s["loadavg_1m"] = med([(r.get("loadavg_start") or [None])[0] for r in rs])
        if len(ok) < len(rs):
            s["failed"] = [tail(r.get("stderr_tail") or "", 1)[:200] for r in rs if not r["ok"]]
        out.append(s)
    # ratios: sluice-auto over each other system in the same cell (the
    # transformers cell has no budget: it is the same for every budget)
    by = {(s["model"], s["budget"], s["batch"], s["system"]): s for s in out}
    for s in out:
        if s["system"] != "sluice-auto" or not s["throughput_tok_s"]:
            continue
        s["ratios"] = {}
        for other in ("sluice-flexgen", "accelerate", "transformers", "flexgen"):
            o = by.get((s["model"], None if other == "transformers" else s["budget"], s["batch"], other))
            if o and o["throughput_tok_s"]:
                s["ratios"][other] = s["throughput_tok_s"] / o["throughput_tok_s"]
            if o and s.get("tok_s_per_probe_gbps") and o.get("tok_s_per_probe_gbps"):
                s.setdefault("ratios_per_probe", {})[other] = s["tok_s_per_probe_gbps"] / o["tok_s_per_probe_gbps"]
    return out


def fmt(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"


def mib(v):
    return "n/a" if v is None else f"{v / 2**20:.0f}"


def reps_text(mach):
    """"3 repetition(s)", or per model where a model has its own count."""
    per = {m: g.get("repeat", mach["repeat"]) for m, g in mach.get("grid", {}).items()}
    if len(set(per.values())) > 1:
        return ", ".join(f"{m}: {n} repetition(s)" for m, n in per.items())
    return f"{mach['repeat']} repetition(s)"


def order_key(s, budgets):
    return (s["model"], budgets.get((s["model"], s["budget"]), -1), s["batch"], SYSTEMS.index(s["system"]))


def report(jsonl, plots=True):
    """Write JSONL's .md (and plots) from its records; the summaries are
    (re)written into the .jsonl. Returns the .md path."""
    recs = [json.loads(l) for l in open(jsonl) if l.strip()]
    recs = [r for r in recs if r.get("type") != "summary"]
    mach = next((r for r in recs if r.get("type") == "machine"), None)
    if mach is None:
        raise ConfigError(f"{jsonl}: no machine record (not a compare.py results file)")
    end = next((r for r in recs if r.get("type") == "end"), None)
    sums = summarize(recs)
    with open(jsonl, "w") as f:
        for r in recs + sums:
            f.write(json.dumps(r) + "\n")
    stem = jsonl[:-len(".jsonl")] if jsonl.endswith(".jsonl") else jsonl
    budgets = {}
    for model, spec in mach["grid"].items():
        for i, b in enumerate(spec["budgets"]):
            budgets[(model, parse_budget(b)["name"])] = i
    sums.sort(key=lambda s: order_key(s, budgets))
    m, v = mach["machine"], mach["versions"]
    runs = [r for r in recs if r.get("type") == "run"]
    L = [f"# sluice against Hugging Face Accelerate, transformers and FlexGen, {mach['date_utc']} UTC\n",
         "## Machine and versions\n",
         f"- CPU: {m.get('cpu_model')} ({m.get('sockets')} socket x {m.get('cores_per_socket')} cores x "
         f"{m.get('threads_per_core')} threads, {m.get('logical_cpus')} logical CPUs); memory "
         f"{m.get('mem_total_gib')} GiB; GPU: {m.get('gpu')}",
         f"- Disk (the work folder, checkpoints and offload files): {m.get('disk_device')}, "
         f"{m.get('disk_free_gib')} GiB free at the start",
         f"- sluice {v.get('sluice')} (git {v.get('git')}{', uncommitted changes' if v.get('git_dirty') else ''}); "
         f"Python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
         f"accelerate {v.get('accelerate') or 'not installed'}, flexgen {v.get('flexgen') or 'not installed'}; "
         f"CUDA for torch: {'yes' if v.get('cuda') else 'no'}; torch threads {v.get('torch_threads')}",
         f"- Load average (1, 5, 15 min) at the start {mach.get('loadavg_start')}"
         + (f", at the end {end.get('loadavg_end')}; the run took "
            f"{(end['t_end'] - mach['t_start']) / 60:.1f} min" if end else " (the run did not finish)")
         + f"; this script ran at nice {mach.get('nice')}.",
         f"- Workload: prompt {mach['prompt_len']}, {mach['gen_len']} new tokens (greedy, EOS ignored in the "
         f"timed runs), {reps_text(mach)} per cell, interleaved (the order reversed every "
         f"other repetition); medians. Hugging Face dtype: {mach['hf_dtype']} (the checkpoint is fp16).",
         f"- Command: `{' '.join(shlex.quote(x) for x in mach['argv'])}`\n"]
    L.append("## Budgets\n")
    L.append("| model | budget | sluice | Accelerate (max_memory) | RAM per run (cgroup) |")
    L.append("|---|---|---|---|---|")
    for model, spec in mach["grid"].items():
        for bs in spec["budgets"]:
            b = parse_budget(bs)
            sl = f"--gpu-mem {fmt_size(b['gpu'])}" + (f" --cpu-mem {fmt_size(b['cpu'])}" if b["cpu"] else "")
            acc = next((r["result"].get("max_memory") for r in runs if r["system"] == "accelerate"
                        and r["model"] == model and r["budget"] == b["name"] and r["ok"]), "?")
            acc = ("none (all in RAM)" if acc is None else
                   ", ".join(f"{k}: {fmt_size(x)}" for k, x in acc.items()) if isinstance(acc, dict) else acc)
            ram = fmt_size(b["ram"]) if b["ram"] else "the machine's"
            L.append(f"| {model} | {b['name']} | {sl}, the rest on disk | {acc}, the rest in its offload folder "
                     f"| {ram} |")
    L.append("\nOn the CPU backend sluice's \"device\" (--gpu-mem) is an arena in RAM and its host tier "
             "(--cpu-mem) is RAM too; Accelerate on a CPU-only machine has one memory tier, so it is given "
             "the sum (the RAM sluice may hold weights, cache and activations in) and the disk for the rest; "
             "with the host uncapped it is given no cap, as sluice may then hold everything in RAM. "
             "max_memory bounds Accelerate's weights only (its KV cache and activations come on top); "
             "sluice's budgets bound its weights, cache and activations together. "
             "Where a budget has a RAM cap (ram=SIZE), every system's run is a process in a memory cgroup of "
             "that limit, which counts its RSS and the page cache it fills together, as on a machine with that "
             "much RAM; the checkpoint's and sluice's store's pages are dropped from the page cache before "
             "each run (posix_fadvise). Without one, a system that reads offloaded weights through the page "
             "cache (Accelerate) reads them from the machine's spare RAM after the first pass; sluice reads "
             "its disk tier with O_DIRECT either way.\n")
    largest = {(r["model"], r["budget"]): r for r in recs if r.get("type") == "largest_batch"}
    if largest:
        L.append("## Largest batch that fits\n")
        L.append("For `--batches ...,max`: per budget, the largest batch up to the cap (`--max-batch`) for which "
                 "sluice's policy search finds a policy that fits the budget, the block one micro-batch "
                 "(bisection; every probe is in the .jsonl). Every system then runs that batch; Accelerate's "
                 "max_memory bounds its weights only, so it is not a limit of Accelerate's own.\n")
        L.append("| model | budget | largest batch | probes |")
        L.append("|---|---|---:|---:|")
        for (model, budget), r in largest.items():
            n = ("none fits" if r["batch"] is None and not r.get("error") else
                 f"failed: {r['error']}" if r.get("error") else
                 f"{r['batch']}" + (" (the cap)" if r.get("capped") else ""))
            L.append(f"| {model} | {budget} | {n} | {len(r.get('probes') or [])} |")
        L.append(f"\nProbe command: `{next(iter(largest.values()))['cmd']}`\n")
    L.append("## Results (medians)\n")
    hdr = ["model", "budget", "batch", "system", "tok/s", "prefill s", "decode s", "peak RSS MiB",
           "RAM peak MiB (cgroup)", "on disk MiB", "read from disk MiB", "same tokens as sluice", "placement",
           "load"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for s in sums:
        place = ""
        if s.get("policy"):
            place = "; ".join(s["policy"])
            if s["batch_run"] and s["batch_run"] != s["batch"]:
                place += f" (ran batch {s['batch_run']:g})"
            pk = s.get("peak_bytes") or {}
            if pk:
                place += " peak " + "/".join(mib(pk.get(t)) for t in ("device", "host", "disk")) + " MiB dev/host/disk"
        elif s.get("device_map_bytes"):
            place = ", ".join(f"{k} {mib(x)} MiB" for k, x in sorted(s["device_map_bytes"].items()))
        ag = s.get("agree")
        ags = f"{ag['same']}/{ag['n']}" if ag else ("(itself)" if s["system"].startswith("sluice") else "n/a")
        lb = largest.get((s["model"], s["budget"]))
        bcol = str(s["batch"]) + (" (largest)" if lb and lb.get("batch") == s["batch"] else "")
        row = [s["model"], s["budget"] or "all in RAM", bcol, s["system"],
               fmt(s["throughput_tok_s"]), fmt(s["prefill_s"], 3), fmt(s["decode_s"], 3), mib(s["peak_rss_bytes"]),
               mib(s.get("cgroup_peak_bytes")), mib(s.get("disk_bytes")), mib(s.get("os_read_bytes")), ags,
               place or "-", fmt(s["loadavg_1m"], 1)]
        if s["n_ok"] < s["n_runs"]:
            row[4] += f" ({s['n_ok']}/{s['n_runs']} ok)"
        L.append("| " + " | ".join(row) + " |")
    rat = [s for s in sums if s.get("ratios")]
    if rat:
        L.append("\n## Ratios: sluice --policy auto over each system (medians' ratio)\n")
        L.append("| model | budget | batch | / sluice FlexGen-style | / Accelerate | / transformers (all in RAM) |")
        L.append("|---|---|---:|---:|---:|---:|")
        for s in rat:
            r = s["ratios"]
            L.append(f"| {s['model']} | {s['budget']} | {s['batch']} | {fmt(r.get('sluice-flexgen'))} | "
                     f"{fmt(r.get('accelerate'))} | {fmt(r.get('transformers'))} |")
    probed = [s for s in sums if s.get("disk_probe_gbps")]
    if probed:
        L.append("\n## The disk's rate around each run\n")
        L.append("Before and after each run of a budget with a disk tier, compare.py reads a file in the work "
                 "folder with O_DIRECT (`disk_probe`: 4 MiB requests, one at a time; each run's pair is in the "
                 ".jsonl). The rate is the pair's mean, medians over a cell's runs; the last column is sluice --policy "
                 "auto's tokens/s per probe GB/s over each system's. A probe of a second beside a run of "
                 "minutes samples the disk: read this as a check on a disk-bound ratio (how far the disk's "
                 "moves could explain it), not as a corrected ratio.\n")
        L.append("| model | budget | batch | system | disk GB/s around the runs | tok/s per disk GB/s | "
                 "sluice-auto / system, per disk GB/s |")
        L.append("|---|---|---:|---|---:|---:|---:|")
        auto = {(s["model"], s["budget"], s["batch"]): s for s in probed if s["system"] == "sluice-auto"}
        for s in probed:
            a_ = auto.get((s["model"], s["budget"], s["batch"]))
            rp = (a_.get("ratios_per_probe") or {}).get(s["system"]) if a_ else None
            L.append(f"| {s['model']} | {s['budget']} | {s['batch']} | {s['system']} | "
                     f"{fmt(s['disk_probe_gbps'])} | {fmt(s['tok_s_per_probe_gbps'])} | "
                     f"{fmt(rp) if s['system'] != 'sluice-auto' else '-'} |")
    skips = [r for r in recs if r.get("type") == "skip"]
    if skips or mach.get("skipped_systems"):
        L.append("\n## Not run\n")
        for k, why in (mach.get("skipped_systems") or {}).items():
            L.append(f"- {k}: {why}")
        for r in skips:
            L.append(f"- {r['system']} {r['model']} {r.get('budget') or ''} batch {r['batch']}: {r['reason']}")
    bad = [r for r in runs if not r["ok"]]
    if bad:
        L.append("\n## Failed runs\n")
        for r in bad:
            why = tail(r.get('stderr_tail') or r.get('stdout_tail') or '', 1)[:200]
            if r.get("cgroup_oom_kills"):
                why = f"killed at the RAM cap ({fmt_size(r['ram_cap_bytes'])}); " + why
            L.append(f"- {r['system']} {r['model']} {r['budget']} batch {r['batch']} rep {r['repeat_idx']}: "
                     f"rc {r['rc']}: {why}")
    refs = [r for r in recs if r.get("type") == "reference"]
    if refs:
        L.append("\n## Reference tokens\n")
        for r in refs:
            L.append(f"- {r['model']}: `{r['cmd']}`: "
                     + (f"{r['n']} sequences, {r['ended_at_eos']} ended at EOS (compared up to it)"
                        if r["rc"] == 0 else f"FAILED rc {r['rc']}"))
    L.append("\n## FlexGen\n")
    if any(r["system"] == "flexgen" for r in runs):
        L.append("Measured here (python -m flexgen.flex_opt, _DUMMY_ weights): see the table.")
    else:
        L.append("Not measured here (" + ("no CUDA GPU" if not v.get("cuda") else "the flexgen package is not installed")
                 + "). Its **published** numbers, not measured here (FlexGen README and "
                 "benchmark/batch_size_table.md: GCP T4 16 GB, 208 GB DRAM, 1.5 TB NVMe; prompt 512, 32 new "
                 "tokens; the 30B and 175B FlexGen figures are projections from a few decode steps):\n")
        L.append("| system | model | tok/s (published) | effective batch | lowest tier |")
        L.append("|---|---|---:|---:|---|")
        for sysname, model, t, b, tier in PUBLISHED:
            L.append(f"| {sysname} | {model} | {t:g} | {b} | {tier} |")
    L.append("\n## Commands (the first run of each system; the others differ in the batch and budget)\n")
    seen = set()
    for r in runs:
        if r["system"] not in seen:
            seen.add(r["system"])
            L.append(f"- {r['system']}: `{r['cmd']}`")
    L.append("\ntokens/s = batch x new tokens / (prefill + decode), a warm-up excluded (FlexGen's metric). "
             "sluice: `sluice bench` (prefill = the prompt's forward pass and the first token). Hugging Face: one "
             "`generate` call, prefill = its start to its first new token (a streamer's clock). Each run is a "
             "process of its own; peak RSS is its wait4(2) rusage (ru_maxrss); \"RAM peak\" (under a RAM "
             "cap) its cgroup's peak charge, RSS and page cache together; \"read from disk\" the bytes it read "
             "through the block layer (ru_inblock x 512: page cache hits are not reads). \"on disk\": what the system "
             "keeps on disk for the job (sluice: its disk tier's peak, the weight store and cache pages; "
             "Accelerate: the weights its device map puts on disk, read from the checkpoint in place or from "
             "its offload folder); the .jsonl also has each process's block-layer writes "
             "(os_write_bytes, ru_oublock x 512), which include sluice bench's 1 GiB disk probe. sluice's peaks per tier are its own counters. "
             "\"same tokens as sluice\": sequences whose greedy tokens equal sluice generate's on the same ids "
             "(fp32 and fp16 paths may differ on near-ties). load = the 1-minute load average as the run began. "
             "Every run, with its exact command, is in the .jsonl.")
    if plots:
        L.extend(plot(stem, sums, mach))
    md = stem + ".md"
    with open(md, "w") as f:
        f.write("\n".join(L) + "\n")
    return md


def plot(stem, sums, mach):
    """The three figures; the markdown lines that show them."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["\n(No plots: matplotlib is not installed in this Python.)"]
    base = os.path.basename(stem)
    colors = {"sluice-auto": "C0", "sluice-flexgen": "C1", "accelerate": "C2", "transformers": "C3",
              "flexgen": "C4"}
    models = list(mach["grid"])
    ok = [s for s in sums if s["throughput_tok_s"]]
    out = ["\n## Plots\n"]

    def save(fig, name, title):
        for ext in ("png", "svg"):
            fig.savefig(f"{stem}-{name}.{ext}", dpi=110, bbox_inches="tight")
        plt.close(fig)
        out.append(f"![{title}]({base}-{name}.png) (also `{base}-{name}.svg`)\n")

    # tokens/s against the budget, per model, each budget at the largest
    # batch run under it (with 'max', what it fits)
    fig, axs = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axs[0], models):
        bl = [parse_budget(b) for b in mach["grid"][model]["budgets"]]
        bmax = {b["name"]: max((s["batch"] for s in ok if s["model"] == model and s["budget"] == b["name"]),
                               default=None) for b in bl}
        for sysname in SYSTEMS:
            xs, ys = [], []
            for i, b in enumerate(bl):
                s = next((s for s in ok if s["model"] == model and s["batch"] == bmax[b["name"]]
                          and s["system"] == sysname
                          and (s["budget"] == b["name"] or (sysname == "transformers" and s["budget"] is None))), None)
                if s:
                    xs.append(i)
                    ys.append(s["throughput_tok_s"])
            if xs:
                ax.plot(xs, ys, "o-", color=colors[sysname], label=sysname)
        ax.set_xticks(range(len(bl)))
        ax.set_xticklabels([f"{b['name']}, batch {bmax[b['name']]}\ngpu {fmt_size(b['gpu'])}, cpu {fmt_size(b['cpu'])}"
                            for b in bl], fontsize=8)
        ax.set_title(f"{model}, each budget at its largest batch", fontsize=10)
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axs[0][0].legend(fontsize=8)
    save(fig, "budget", "tokens/s against the memory budget")

    # tokens/s against the batch, per model and budget
    panels = [(model, parse_budget(b)) for model in models for b in mach["grid"][model]["budgets"]]
    fig, axs = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (model, b) in zip(axs[0], panels):
        for sysname in SYSTEMS:
            pts = sorted((s["batch"], s["throughput_tok_s"]) for s in ok if s["model"] == model
                         and s["system"] == sysname and (s["budget"] == b["name"] or
                                                         (sysname == "transformers" and s["budget"] is None)))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[sysname], label=sysname)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{model}, {b['name']} budget", fontsize=10)
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axs[0][0].legend(fontsize=8)
    save(fig, "batch", "tokens/s against the batch size")

    # a bar chart per workload (model, batch): systems grouped by budget
    work = sorted({(s["model"], s["batch"]) for s in ok}, key=lambda w: (models.index(w[0]), w[1]))
    fig, axs = plt.subplots(1, len(work), figsize=(3.8 * len(work), 3.6), squeeze=False)
    for ax, (model, batch) in zip(axs[0], work):
        bl = [parse_budget(b)["name"] for b in mach["grid"][model]["budgets"]]
        systems = [x for x in SYSTEMS if any(s["system"] == x and s["model"] == model for s in ok)]
        w = 0.8 / max(1, len(systems))
        for j, sysname in enumerate(systems):
            ys = []
            for b in bl:
                s = next((s for s in ok if s["model"] == model and s["batch"] == batch and s["system"] == sysname
                          and (s["budget"] == b or (sysname == "transformers" and s["budget"] is None))), None)
                ys.append(s["throughput_tok_s"] if s else 0)
            ax.bar([i + j * w for i in range(len(bl))], ys, w, color=colors[sysname], label=sysname)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(bl))])
        ax.set_xticklabels(bl)
        ax.set_title(f"{model}, P{mach['prompt_len']} G{mach['gen_len']}, batch {batch}", fontsize=9)
        ax.set_ylabel("tokens/s")
        ax.grid(axis="y", alpha=0.3)
    axs[0][0].legend(fontsize=7)
    save(fig, "bars", "tokens/s per workload")
    return out


# ---- arguments ---------------------------------------------------------------

def build_grid(a):
    """{model: {"budgets": [spec], "batches": [int], "repeat": int}} from --config
    (a model's own "repeat" overrides the global one), the flags
    and the defaults; ConfigError when something is wrong."""
    cfg = {}
    if a.config:
        try:
            cfg = json.load(open(a.config))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{a.config}: {e}")
        if not isinstance(cfg, dict):
            raise ConfigError(f"{a.config}: want a JSON object")
        unknown = set(cfg) - {"models", "prompt_len", "gen_len", "repeat", "batches", "budgets"}
        if unknown:
            raise ConfigError(f"{a.config}: unknown keys {sorted(unknown)}")
        for k in ("prompt_len", "gen_len", "repeat"):
            if k in cfg and getattr(a, k) is None:
                setattr(a, k, cfg[k])
    if a.quick:
        for k in ("prompt_len", "gen_len", "repeat"):
            if getattr(a, k) is None:
                setattr(a, k, QUICK[k])
    a.prompt_len = 128 if a.prompt_len is None else a.prompt_len
    a.gen_len = 32 if a.gen_len is None else a.gen_len
    a.repeat = 3 if a.repeat is None else a.repeat
    for k in ("prompt_len", "gen_len", "repeat"):
        if not isinstance(getattr(a, k), int) or getattr(a, k) < 1:
            raise ConfigError(f"{k.replace('_', '-')} must be an integer >= 1")
    if not isinstance(a.max_batch, int) or a.max_batch < 1:
        raise ConfigError("max-batch must be an integer >= 1")
    if a.prompt_len + a.gen_len > hfb.MAX_POS:
        raise ConfigError(f"prompt-len + gen-len must be <= {hfb.MAX_POS}")
    models = cfg.get("models")
    if a.models:
        models = a.models.split(",")
    if a.quick and not models:
        models = QUICK["models"]
    models = models or ["opt-125m", "opt-1.3b"]
    if isinstance(models, list):
        models = {m: {} for m in models}
    grid = {}
    for model, spec in models.items():
        if model not in hfb.MODELS or model == "opt-350m":
            raise ConfigError(f"unknown model '{model}' (want one of "
                              f"{', '.join(m for m in hfb.MODELS if m != 'opt-350m')})")
        d = DEFAULTS.get(model, {"budgets": [], "batches": [1]})
        budgets = a.budget or spec.get("budgets") or cfg.get("budgets") or (QUICK["budgets"] if a.quick else d["budgets"])
        batches = (a.batches or spec.get("batches") or cfg.get("batches")
                   or (QUICK["batches"] if a.quick else d["batches"]))
        if isinstance(batches, str):
            batches = batches.split(",")
        batches = [b.strip() if isinstance(b, str) else b for b in batches]
        try:
            ints = [int(b) for b in batches if b != "max"]
        except (TypeError, ValueError):
            raise ConfigError(f"{model}: batches must be integers or 'max' (got {batches})")
        if not batches or (ints and min(ints) < 1):
            raise ConfigError(f"{model}: batches must be >= 1")
        batches = sorted(set(ints)) + (["max"] if "max" in batches else [])
        if not budgets:
            raise ConfigError(f"{model}: no budget (give --budget NAME:gpu=SIZE[,cpu=SIZE])")
        names = [parse_budget(b)["name"] for b in budgets]
        if len(set(names)) != len(names):
            raise ConfigError(f"{model}: budget names must differ ({names})")
        rep = spec.get("repeat", a.repeat)
        if not isinstance(rep, int) or rep < 1:
            raise ConfigError(f"{model}: repeat must be an integer >= 1")
        grid[model] = {"budgets": list(budgets), "batches": batches, "repeat": rep}
    return grid


def main(argv=None):
    ap = argparse.ArgumentParser(description="sluice against Accelerate, transformers and FlexGen (issue 16)")
    ap.add_argument("--quick", action="store_true", help="opt-125m, one budget, one batch, one repetition")
    ap.add_argument("--config", help="a JSON file: models (a list, or {model: {budgets, batches}}), "
                    "prompt_len, gen_len, repeat, batches, budgets")
    ap.add_argument("--models", help="comma-separated: opt-125m,opt-1.3b,...")
    ap.add_argument("--budget", action="append", help="NAME:gpu=SIZE[,cpu=SIZE] (repeatable; every model)")
    ap.add_argument("--batches", help="comma-separated batch sizes (every model); 'max': per budget, the "
                    "largest batch up to --max-batch that sluice's search fits in it (Harness.largest_batch)")
    ap.add_argument("--max-batch", type=int, default=64,
                    help="the most 'max' resolves to (default 64): runs grow with the batch")
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--gen-len", type=int)
    ap.add_argument("--repeat", type=int, help="runs of each cell; the median is reported (default 3)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--hf-dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                    help="the dtype the Hugging Face systems load the fp16 checkpoint in (default fp32; on a "
                    "CPU with AMX-BF16 bf16 is the fastest but its tokens drift from fp16's: "
                    "bench/results/compare-dtype-20261205.md)")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--sluice-flags", help="more flags for every sluice bench run (e.g. '--cpu-gemm amx'); "
                    "the reference tokens are generated without them")
    ap.add_argument("--disk-probe", type=probe_size, default=1 << 30, metavar="SIZE",
                    help="before and after each run of a budget with a disk tier, read SIZE (default 1G) of a "
                    "file in --work with O_DIRECT and record the rate (disk_probe); 0: no probe")
    ap.add_argument("--python", default=sys.executable, help="the Python of the Hugging Face workers")
    ap.add_argument("--work", default="/tmp/sluice-compare",
                    help="checkpoints, offload folders and the profile (kept between runs)")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run (0: none)")
    ap.add_argument("--seed", type=int, default=1, help="prompt ids, as sluice bench --seed")
    ap.add_argument("--ckpt-seed", type=int, default=0, help="the dummy checkpoints' torch seed")
    ap.add_argument("--report", metavar="FILE.jsonl", help="only remake FILE's .md and plots")
    ap.add_argument("--quiet", action="store_true")
    # internal: the workers
    ap.add_argument("--worker", choices=("accelerate", "transformers"), help=argparse.SUPPRESS)
    ap.add_argument("--write-checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--offload-folder", help=argparse.SUPPRESS)
    ap.add_argument("--max-cpu", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--max-gpu", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a)
    if a.write_checkpoint:
        return write_checkpoint_main(a)
    try:
        if a.report:
            if not os.path.isfile(a.report):
                raise ConfigError(f"{a.report}: no such file")
            print(report(a.report))
            return 0
        a.systems = [s for s in a.systems.split(",") if s]
        bad = [s for s in a.systems if s not in SYSTEMS]
        if bad:
            raise ConfigError(f"unknown system(s) {bad} (want {', '.join(SYSTEMS)})")
        grid = build_grid(a)
        if not (os.path.isfile(a.sluice) and os.access(a.sluice, os.X_OK)):
            raise ConfigError(f"{a.sluice}: not an executable (build sluice: ninja -C build)")
        if any(parse_budget(b)["ram"] for spec in grid.values() for b in spec["budgets"]):
            RamCap(1 << 30, "check").close()  # a RAM cap that cannot be had: said before anything runs
        return Harness(a, grid).run()
    except ConfigError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
