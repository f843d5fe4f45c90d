#!/usr/bin/env bash
# tests/test_convert_cli.sh SLUICE MODELS - the weights' disk store from the
# command line: the issue's reproduction (a checkpoint changed after its
# store was written must give the output of the same model without
# offloading), and `sluice convert` writing, listing and cleaning stores.
# MODELS is the repository's models/ folder (the bundled opt-tiny-kjv).
set -u
sluice=$1
models=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# zero_tensor CKPT SUFFIX...: zero the tensors whose names end with a SUFFIX
# in CKPT/model.safetensors, in place (same size, same header)
zero_tensor() {
	python3 - "$@" <<'PY'
import json, struct, sys
ckpt, suffixes = sys.argv[1], sys.argv[2:]
with open(ckpt + "/model.safetensors", "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    for name, t in header.items():
        if name != "__metadata__" and any(name.endswith(s) for s in suffixes):
            b, e = t["data_offsets"]
            f.seek(8 + n + b)
            f.write(b"\0" * (e - b))
PY
}
zero_mlp() { # CKPT: fc1 and fc2 of every layer, the issue's change
	zero_tensor "$1" fc1.weight fc2.weight
}

cp -r "$models/opt-tiny-kjv" "$tmp/m"
head -4 "$models/../tools/demo-prompts.jsonl" >"$tmp/in.jsonl"
gen=(generate --backend cpu --quiet --prompts "$tmp/in.jsonl" --max-new-tokens 8 --batch-size 2)
disk=(--percent 0 0 100 0 100 0 --offload-dir "$tmp/D")
mkdir "$tmp/D"

# 1. The reproduction: weights on disk, then fc1/fc2 zeroed in place.
"$sluice" "${gen[@]}" --model "$tmp/m" "${disk[@]}" --out "$tmp/a.jsonl" || bad "first job failed"
zero_mlp "$tmp/m"
"$sluice" "${gen[@]}" --model "$tmp/m" "${disk[@]}" --out "$tmp/b.jsonl" 2>"$tmp/b.err" || bad "job after the change failed"
"$sluice" "${gen[@]}" --model "$tmp/m" --out "$tmp/c.jsonl" || bad "job without offloading failed"
if cmp -s "$tmp/a.jsonl" "$tmp/c.jsonl"; then bad "zeroing the MLP weights did not change the output"; else ok; fi
if cmp -s "$tmp/b.jsonl" "$tmp/c.jsonl"; then ok; else bad "the changed checkpoint's output with weights on disk differs from without: stale store"; fi
if grep -q "weights.sluice is out of date (the checkpoint's weight files changed since it was written); writing it again" "$tmp/b.err" &&
	[ "$(wc -l <"$tmp/b.err")" -eq 1 ]; then ok; else bad "the rewrite is not said in one line: $(cat "$tmp/b.err")"; fi
if [ "$(ls "$tmp/D" | grep -c 'weights.sluice$')" -eq 1 ]; then ok; else bad "the old store was kept: $(ls "$tmp/D")"; fi
# the same again, the modification time set back: still detected
touch -r "$tmp/m/model.safetensors" "$tmp/mtime"
zero_tensor "$tmp/m" layers.0.self_attn_layer_norm.weight
touch -r "$tmp/mtime" "$tmp/m/model.safetensors"
"$sluice" "${gen[@]}" --model "$tmp/m" "${disk[@]}" --out "$tmp/d.jsonl" 2>/dev/null || bad "job after the second change failed"
"$sluice" "${gen[@]}" --model "$tmp/m" --out "$tmp/e.jsonl" || bad "job without offloading failed"
if cmp -s "$tmp/d.jsonl" "$tmp/e.jsonl" && ! cmp -s "$tmp/e.jsonl" "$tmp/c.jsonl"; then ok; else bad "a change with the mtime set back was missed"; fi

# 2. sluice convert writes the store a job then reuses (nothing written).
mkdir "$tmp/D2"
if "$sluice" convert --model "$tmp/m" --percent 0 0 100 0 100 0 --offload-dir "$tmp/D2" >"$tmp/cv.out" &&
	grep -q "^wrote $tmp/D2/m\.[0-9a-f]\{8\}\.w0-0\.weights\.sluice in " "$tmp/cv.out"; then ok; else bad "convert: $(cat "$tmp/cv.out")"; fi
if "$sluice" "${gen[@]}" --model "$tmp/m" --percent 0 0 100 0 100 0 --offload-dir "$tmp/D2" --out "$tmp/f.jsonl" \
	--stats "$tmp/f.stats" && cmp -s "$tmp/f.jsonl" "$tmp/e.jsonl" &&
	python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['disk_write_bytes'] == 0" "$tmp/f.stats"; then ok
else bad "the job did not reuse the converted store"; fi
if "$sluice" convert --model "$tmp/m" --percent 0 0 100 0 100 0 --offload-dir "$tmp/D2" | grep -q "is current already$"; then ok
else bad "converting again rewrote the store"; fi
# another placement and a dummy model beside it
"$sluice" convert --model "$tmp/m" --percent 0 50 100 0 100 0 --offload-dir "$tmp/D2" >/dev/null || bad "convert 0/50"
"$sluice" convert --dummy opt-125m --percent 90 0 100 0 100 0 --offload-dir "$tmp/D2" >/dev/null || bad "convert dummy"
"$sluice" convert --offload-dir "$tmp/D2" --list >"$tmp/list1"
if [ "$(grep -c '^current ' "$tmp/list1")" -eq 3 ] && grep -q "opt-125m\.dummy\.w90-0\.weights\.sluice  dummy opt-125m, weights 90% device, 0% host, 10% disk" "$tmp/list1" &&
	grep -q "\.w0-50\.weights\.sluice  checkpoint .*/m, weights 0% device, 50% host, 50% disk$" "$tmp/list1" &&
	tail -1 "$tmp/list1" | grep -q "^3 stores, .*; 0 not current$"; then ok; else bad "--list: $(cat "$tmp/list1")"; fi

# 3. The checkpoint changes: --list says stale and why, --clean removes
# those, leaving the current dummy store.
zero_tensor "$tmp/m" layers.1.fc1.bias
"$sluice" convert --offload-dir "$tmp/D2" --list >"$tmp/list2"
if [ "$(grep -c "^stale .*: the checkpoint's weight files changed since it was written$" "$tmp/list2")" -eq 2 ]; then ok
else bad "--list after a change: $(cat "$tmp/list2")"; fi
echo "not a store" >"$tmp/D2/notes.weights.sluice" # a file --clean must not take for one
"$sluice" convert --offload-dir "$tmp/D2" --clean >"$tmp/clean"
if [ "$(grep -c "^removed $tmp/D2/m\..*, stale: " "$tmp/clean")" -eq 2 ] && tail -1 "$tmp/clean" | grep -q "^removed 2 stores" &&
	grep -q "^kept $tmp/D2/notes.weights.sluice: .*not a sluice store" "$tmp/clean" &&
	[ "$(ls "$tmp/D2" | tr '\n' ' ')" = "notes.weights.sluice opt-125m.dummy.w90-0.weights.sluice " ]; then ok
else bad "--clean: $(cat "$tmp/clean"); left $(ls "$tmp/D2")"; fi

# 4. --clean leaves a store a running job holds, even a stale one.
cp -r "$models/opt-tiny-kjv" "$tmp/m3"
mkdir "$tmp/D3"
for i in $(seq 8); do echo "{\"prompt\": \"And the LORD said $i\"}"; done >"$tmp/in8.jsonl"
SLUICE_TEST_BLOCK_DELAY_MS=700 "$sluice" generate --backend cpu --quiet --model "$tmp/m3" --prompts "$tmp/in8.jsonl" \
	--batch-size 1 --max-new-tokens 2 --percent 0 0 100 0 100 0 --offload-dir "$tmp/D3" --out "$tmp/slow.jsonl" &
job=$!
for _ in $(seq 100); do
	"$sluice" convert --offload-dir "$tmp/D3" --list 2>/dev/null | grep -q '^current .*(in use)$' && break
	sleep 0.1
done
zero_mlp "$tmp/m3"
"$sluice" convert --offload-dir "$tmp/D3" --clean >"$tmp/clean3"
if grep -q "^kept $tmp/D3/m3\..*: in use by a running job$" "$tmp/clean3" && [ -n "$(ls "$tmp/D3")" ]; then ok
else bad "--clean with a job running: $(cat "$tmp/clean3")"; fi
wait $job || bad "the job holding the store failed"
"$sluice" convert --offload-dir "$tmp/D3" --clean >/dev/null
if [ -z "$(ls "$tmp/D3")" ]; then ok; else bad "--clean after the job left $(ls "$tmp/D3")"; fi

# 5. zstd frames: convert --zstd writes a .zst store that jobs then read
# in place of the plain store (the tokens of the job without offloading,
# nothing written, fewer bytes read), streamed whole and by halves; a
# corrupt frame or frame table is refused in one line naming the store.
# The job's prediction counts the store it read: with a profile whose
# zstd_gbps is tiny, the decompression dominates it.
cp -r "$models/opt-tiny-kjv" "$tmp/mz"
mkdir "$tmp/DZ" "$tmp/DP"
"$sluice" profile --quick --backend cpu --threads 2 --json "$tmp/zprof0.json" >/dev/null || bad "zstd: profile failed"
python3 - "$tmp/zprof0.json" "$tmp/zprof.json" <<'PY' || bad "zstd: the profile has no zstd fields"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["zstd_gbps"] > 0 and 0 < p["zstd_ratio"] < 1, (p["zstd_gbps"], p["zstd_ratio"])
p["zstd_gbps"] = 1e-4
json.dump(p, open(sys.argv[2], "w"))
PY
zgen=("${gen[@]}" --model "$tmp/mz" --percent 0 0 100 0 100 0 --threads 2 --profile "$tmp/zprof.json")
"$sluice" "${gen[@]}" --model "$tmp/mz" --out "$tmp/z0.jsonl" || bad "zstd: the job without offloading failed"
"$sluice" "${zgen[@]}" --offload-dir "$tmp/DP" --out "$tmp/zp.jsonl" --stats "$tmp/zp.stats" || bad "zstd: plain job failed"
if "$sluice" convert --model "$tmp/mz" --percent 0 0 100 0 100 0 --offload-dir "$tmp/DZ" --zstd >"$tmp/zc.out" &&
	grep -q "^wrote $tmp/DZ/mz\.[0-9a-f]\{8\}\.w0-0\.zst\.weights\.sluice in " "$tmp/zc.out"; then ok
else bad "convert --zstd: $(cat "$tmp/zc.out")"; fi
zstore=$(ls "$tmp"/DZ/*.zst.weights.sluice)
printf '{"gpu_batch_size": 2, "num_gpu_batches": 1, "w_gpu_percent": 0, "w_cpu_percent": 0, "sep_layer": false}\n' >"$tmp/whole.json"
for how in halves whole; do
	extra=()
	[ $how = whole ] && extra=(--policy "$tmp/whole.json" --percent 0 0 100 0 100 0)
	if "$sluice" "${zgen[@]}" "${extra[@]}" --offload-dir "$tmp/DZ" --out "$tmp/z-$how.jsonl" --stats "$tmp/z-$how.stats" &&
		cmp -s "$tmp/z-$how.jsonl" "$tmp/z0.jsonl"; then ok; else bad "zstd store, $how: tokens differ from the job without offloading"; fi
done
if python3 - "$tmp/z-halves.stats" "$tmp/zp.stats" <<'PY'; then ok; else bad "zstd store: the job wrote, or read no fewer bytes than the plain store's"; fi
import json, sys
z, p = (json.load(open(f)) for f in sys.argv[1:3])
assert z["disk_write_bytes"] == 0, z
assert 0 < z["disk_read_bytes"] < p["disk_read_bytes"], (z["disk_read_bytes"], p["disk_read_bytes"])
# predicted with the store read: 0.1 MB/s of decompression
assert z["predicted_decode_s"] > 10 * p["predicted_decode_s"], (z["predicted_decode_s"], p["predicted_decode_s"])
PY
if [ "$(ls "$tmp/DZ" | wc -l)" -eq 1 ]; then ok; else bad "the job wrote a plain store beside the zstd one: $(ls "$tmp/DZ")"; fi
"$sluice" convert --offload-dir "$tmp/DZ" --list >"$tmp/zlist"
if grep -q "^current .*\.zst\.weights\.sluice  checkpoint .*/mz, weights 0% device, 0% host, 100% disk, zstd level 1$" "$tmp/zlist"; then ok
else bad "--list of a zstd store: $(cat "$tmp/zlist")"; fi
if "$sluice" convert --model "$tmp/mz" --percent 0 0 100 0 100 0 --offload-dir "$tmp/DZ" --zstd | grep -q "is current already$"; then ok
else bad "convert --zstd again rewrote the store"; fi
# the store's frame buffers count in the host budget: one too small names
# the smallest --cpu-mem (before anything loads), which runs, and whose
# host peak reaches it, above the plain store's peak
rm -f "$tmp/zm.jsonl"
"$sluice" "${zgen[@]}" --offload-dir "$tmp/DZ" --cpu-mem 4K --out "$tmp/zm.jsonl" 2>"$tmp/zm.err"
rc=$?
want=$(sed -n 's/.*needs at least --cpu-mem \([0-9.]*[KMG]\).*/\1/p' "$tmp/zm.err")
if [ $rc -ne 0 ] && [ "$(wc -l <"$tmp/zm.err")" -eq 1 ] && [ -n "$want" ] && ! [ -s "$tmp/zm.jsonl" ] &&
	"$sluice" "${zgen[@]}" --offload-dir "$tmp/DZ" --cpu-mem "$want" --out "$tmp/zm.jsonl" --stats "$tmp/zm.stats" &&
	cmp -s "$tmp/zm.jsonl" "$tmp/z0.jsonl" && python3 - "$want" "$tmp/zm.stats" "$tmp/zp.stats" <<'PY'; then ok
import json, sys
w = sys.argv[1]
unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[w[-1]]
step = {"K": 1 << 10, "M": 0.1 * (1 << 20), "G": 0.01 * (1 << 30)}[w[-1]]
named = float(w[:-1]) * unit
z, p = (json.load(open(f))["peak_bytes"]["host"] for f in sys.argv[2:4])
assert named - step < z <= named, (named, z)
assert z > p, (z, p)
PY
else bad "a zstd store under --cpu-mem: exit $rc, named '$want', stderr $(cat "$tmp/zm.err")"; fi
# corrupt_frame STORE: flip bytes inside the first compressed frame (found
# through the frame table at the end of the data area)
corrupt_frame() {
	python3 - "$1" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
t = data.rfind(b"SLZSTD01")
window, nf, nl, level = struct.unpack_from("<4I", data, t + 8)
seg, split = struct.unpack_from("<2Q", data, t + 24)
clen = struct.unpack_from(f"<{nf * nl}I", data, t + 40)
f = next(i for i, c in enumerate(clen) if c)  # a compressed frame
na = -(-split // window)
off = (f % nf) * window if f % nf < na else split + (f % nf - na) * window
at = 4096 + (f // nf) * seg + off + clen[f] // 2
data[at:at + 8] = bytes(b ^ 0x5A for b in data[at:at + 8])
open(path, "r+b").write(data)
PY
}
cp "$zstore" "$tmp/zstore.bak"
corrupt_frame "$zstore"
"$sluice" "${zgen[@]}" --offload-dir "$tmp/DZ" --out "$tmp/zbad.jsonl" 2>"$tmp/zbad.err"
rc=$?
if [ $rc -ne 0 ] && [ "$(wc -l <"$tmp/zbad.err")" -eq 1 ] && grep -q "$zstore: layer [0-9]*, zstd frame [0-9]* is corrupt" "$tmp/zbad.err" &&
	! [ -s "$tmp/zbad.jsonl" ]; then ok; else bad "a corrupt zstd frame: exit $rc, stderr $(cat "$tmp/zbad.err"), out $(cat "$tmp/zbad.jsonl" 2>/dev/null)"; fi
cp "$tmp/zstore.bak" "$zstore"
python3 - "$zstore" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
t = data.rfind(b"SLZSTD01")
data[t + 44] ^= 0xFF  # a frame's length: the table's checksum no longer holds
open(path, "r+b").write(data)
PY
"$sluice" "${zgen[@]}" --offload-dir "$tmp/DZ" --out "$tmp/zbad2.jsonl" 2>"$tmp/zbad2.err"
rc=$?
if [ $rc -ne 0 ] && [ "$(wc -l <"$tmp/zbad2.err")" -eq 1 ] && grep -qF "$zstore: its zstd frame table is corrupt" "$tmp/zbad2.err"; then ok
else bad "a corrupt zstd frame table: exit $rc, stderr $(cat "$tmp/zbad2.err")"; fi
expect() { # NAME RC NEEDLE -- args
	local name=$1 want=$2 needle=$3
	shift 4
	"$sluice" "$@" >/dev/null 2>"$tmp/err"
	local rc=$?
	if [ $rc -eq "$want" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err"; then ok
	else bad "$name: exit $rc, stderr: $(cat "$tmp/err")"; fi
}
expect "zstd level 0" 2 "--zstd=LEVEL takes a level from 1 to 19, got '0'" -- convert --model "$tmp/mz" --percent 0 0 100 0 100 0 --offload-dir "$tmp/DZ" --zstd=0
expect "zstd level text" 2 "got 'fast'" -- convert --model "$tmp/mz" --percent 0 0 100 0 100 0 --offload-dir "$tmp/DZ" --zstd=fast
expect "zstd with --list" 2 "take only --offload-dir" -- convert --offload-dir "$tmp/DZ" --list --zstd

# 6. Usage and folder errors: one line, exit 2 or 1.
expect "no folder" 2 "--offload-dir DIR is required" -- convert --model "$tmp/m" --percent 0 0 100 0 100 0
expect "no placement" 2 "give the placement" -- convert --model "$tmp/m" --offload-dir "$tmp/D2"
expect "nothing on disk" 2 "puts no tensor on disk" -- convert --model "$tmp/m" --percent 60 40 100 0 100 0 --offload-dir "$tmp/D2"
expect "list with a model" 2 "take only --offload-dir" -- convert --model "$tmp/m" --offload-dir "$tmp/D2" --list
expect "unknown option" 2 "unknown option '--bogus'" -- convert --offload-dir "$tmp/D2" --bogus
expect "option without its value" 2 "--offload-dir needs a value" -- convert --list --offload-dir
expect "missing folder" 1 "$tmp/nodir does not exist" -- convert --offload-dir "$tmp/nodir" --list
expect "missing folder, convert" 1 "$tmp/nodir does not exist" -- convert --model "$tmp/m" --percent 0 0 100 0 100 0 --offload-dir "$tmp/nodir"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
