/*
 * test_wstore.c - the weights' disk store against the checkpoint it was
 * made from (runtime/wstore.c).
 *
 * A store must never serve weights other than the checkpoint's as they are
 * now: a checkpoint changed in place (same size, same header; and again
 * with its modification time set back), or one shard of a sharded
 * checkpoint changed, gives the logits of the same model without
 * offloading, and the store is written again in place of the old one.
 * Stores are named per model and placement, so one folder serves several;
 * sl_wstore_list tells current, stale, interrupted and foreign stores
 * apart, and a store a job holds open is never removed.  Logits are
 * compared bit for bit on the CPU backend, where placement does not change
 * the arithmetic.  A weight file's header hash, part of a store's key, is
 * pinned.  argv[1] is the fixtures folder.
 */
#include "backend.h"
#include "model.h"
#include "sl_hash.h"
#include "weights.h"
#include "wstore.h"

#include "testutil.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fixtures_dir = "tests/fixtures";
static char tmp[256]; /* made and removed by the fixture */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void make_tmp(void)
{
	snprintf(tmp, sizeof tmp, "/tmp/sl-wstore-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void rm_tmp(void)
{
	nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Copy the files of fixture NAME into tmp/DST. */
static void copy_fixture(const char *name, const char *dst, char *out, size_t n)
{
	char cmd[1600];
	snprintf(out, n, "%s/%s", tmp, dst);
	snprintf(cmd, sizeof cmd, "cp -r '%s/%s' '%s'", fixtures_dir, name, out);
	ck_assert_int_eq(system(cmd), 0);
}

static void make_subdir(const char *name, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", tmp, name);
	ck_assert_msg(mkdir(out, 0755) == 0, "mkdir %s: %s", out, strerror(errno));
}

/*
 * Zero the bytes of the tensor whose name ends with suffix, in place, in
 * whichever file of ckpt holds it: the size and the header stay the same.
 */
static void zero_tensor(const char *ckpt, const char *suffix)
{
	const char *files[] = { "model.safetensors", "model-00001-of-00002.safetensors",
				"model-00002-of-00002.safetensors" };
	for (size_t f = 0; f < SL_ARRAY_LEN(files); f++) {
		char path[700];
		snprintf(path, sizeof path, "%s/%s", ckpt, files[f]);
		int fd = open(path, O_RDWR);
		if (fd < 0)
			continue;
		uint64_t hlen = 0;
		unsigned char lb[8];
		ck_assert(pread(fd, lb, 8, 0) == 8);
		for (int i = 7; i >= 0; i--)
			hlen = (hlen << 8) | lb[i];
		char *hdr = malloc(hlen + 1);
		ck_assert(pread(fd, hdr, hlen, 8) == (ssize_t)hlen);
		hdr[hlen] = 0;
		json_t *h = json_loads(hdr, 0, NULL);
		ck_assert_ptr_nonnull(h);
		const char *k;
		json_t *v;
		json_object_foreach(h, k, v) {
			size_t kl = strlen(k), sl = strlen(suffix);
			if (kl < sl || strcmp(k + kl - sl, suffix))
				continue;
			json_t *offs = json_object_get(v, "data_offsets");
			size_t b = (size_t)json_integer_value(json_array_get(offs, 0));
			size_t e = (size_t)json_integer_value(json_array_get(offs, 1));
			char *z = calloc(1, e - b);
			ck_assert(pwrite(fd, z, e - b, (off_t)(8 + hlen + b)) == (ssize_t)(e - b));
			free(z);
			json_decref(h);
			free(hdr);
			close(fd);
			return;
		}
		json_decref(h);
		free(hdr);
		close(fd);
	}
	ck_abort_msg("no tensor ending in %s in %s", suffix, ckpt);
}

/* The modification time of every safetensors file in ckpt, and back. */
typedef struct times {
	struct timespec t[3];
	bool have[3];
} times;

static const char *const st_files[] = { "model.safetensors", "model-00001-of-00002.safetensors",
					"model-00002-of-00002.safetensors" };

static void times_get(const char *ckpt, times *o)
{
	for (int f = 0; f < 3; f++) {
		char path[700];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", ckpt, st_files[f]);
		o->have[f] = stat(path, &st) == 0;
		if (o->have[f])
			o->t[f] = st.st_mtim;
	}
}

static void times_set(const char *ckpt, const times *o)
{
	for (int f = 0; f < 3; f++) {
		if (!o->have[f])
			continue;
		char path[700];
		snprintf(path, sizeof path, "%s/%s", ckpt, st_files[f]);
		struct timespec ts[2] = { o->t[f], o->t[f] };
		ck_assert(utimensat(AT_FDCWD, path, ts, 0) == 0);
	}
}

typedef struct run_out {
	float *logits;
	size_t n;
	uint64_t disk_written;
	sl_plan plan; /* the open model's */
} run_out;


/* A plan with the weights gpu% on the device, cpu% in pinned host memory
 * and the rest on disk; everything else as the default. */
static sl_plan_params weights_at(double gpu, double cpu, bool overlap)
{
	sl_plan_params pp = sl_plan_defaults();
	pp.w_gpu = gpu;
	pp.w_cpu = cpu;
	pp.overlap = overlap;
	return pp;
}

/* Prefill logits of the fixture's prompts, weights placed gpu/cpu (the rest
 * in a store in off). */
static int run(const char *ckpt, const char *golden_of, double gpu, double cpu, const char *off, run_out *o)
{
	int np, plen[16];
	int32_t prompts[16][64];
	sl_test_prompts(fixtures_dir, golden_of, &np, plen, prompts);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
	const sl_plan_params pp = weights_at(gpu, cpu, true);
	sl_model_params mp = { .dir = ckpt, .offload_dir = off, .plan = &pp };
	sl_model *m = NULL;
	int rc = sl_model_open_ex(be, &mp, &m);
	if (rc < 0) {
		sl_backend_free(be);
		return rc;
	}
	int t = 0;
	for (int i = 0; i < np; i++)
		t = SL_MAX(t, plen[i]);
	int32_t ids[16 * 64] = { 0 };
	int npad[16];
	for (int s = 0; s < np; s++) {
		npad[s] = t - plen[s];
		memcpy(ids + s * t + npad[s], prompts[s], sizeof(int32_t) * (size_t)plen[s]);
	}
	o->n = (size_t)np * t * m->cfg.vocab;
	o->logits = malloc(sizeof(float) * o->n);
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_create(&m->kv_env, np, t, &kv), 0);
	ck_assert_int_eq(sl_model_prefill(m, kv, ids, npad, t, o->logits), 0);
	sl_kv_free(kv);
	o->disk_written = m->w.stats.disk_write_bytes;
	sl_model_free(m);
	sl_backend_free(be);
	return 0;
}

static bool same(const run_out *a, const run_out *b)
{
	return a->n == b->n && !memcmp(a->logits, b->logits, a->n * sizeof(float));
}

static int count_stores(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "test $(ls '%s' | grep -c 'weights.sluice$') -eq 1", dir);
	return system(cmd) == 0 ? 1 : 0;
}

/* The one FNV-1a 64 (common/sl_hash.h) against the published test vectors
 * of its authors, and chained over two pieces. */
START_TEST(test_fnv1a64_reference)
{
	ck_assert_uint_eq(sl_fnv1a64(SL_FNV1A64_INIT, NULL, 0), 0xcbf29ce484222325ull);
	ck_assert_uint_eq(sl_fnv1a64(SL_FNV1A64_INIT, "a", 1), 0xaf63dc4c8601ec8cull);
	ck_assert_uint_eq(sl_fnv1a64(SL_FNV1A64_INIT, "foobar", 6), 0x85944171f73967e8ull);
	ck_assert_uint_eq(sl_fnv1a64(sl_fnv1a64(SL_FNV1A64_INIT, "foo", 3), "bar", 3),
			  0x85944171f73967e8ull);
}
END_TEST

/* A store's key holds each weight file's header hash (FNV-1a 64 of the
 * 8-byte length and the JSON header): pinned for a fixture, the value a
 * Python transcription of FNV-1a gives, so that stores written by an
 * earlier build stay current. */
START_TEST(test_header_hash_pinned)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_st_set *st = NULL;
	ck_assert_msg(sl_st_open_dir(dir, &st) == 0, "%s", sl_errmsg());
	ck_assert_uint_eq(sl_st_nfiles(st), 1);
	ck_assert_uint_eq(sl_st_file_at(st, 0)->header_hash, 0xc2ac47a700dec68eull);
	sl_st_close(st);
}
END_TEST

/* A tensor's bytes released after conversion (sl_st_release: unmapped
 * from the process's memory) read back the same, in part, whole, past the
 * end and again; so the loader may release what it has converted. */
START_TEST(test_release_keeps_contents)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_st_set *st = NULL;
	ck_assert_msg(sl_st_open_dir(dir, &st) == 0, "%s", sl_errmsg());
	const sl_st_tensor *big = NULL;
	for (size_t i = 0; i < sl_st_count(st); i++)
		if (!big || sl_st_at(st, i)->nbytes > big->nbytes)
			big = sl_st_at(st, i);
	ck_assert(big && big->nbytes > 3 * 4096);
	unsigned char *copy = malloc(big->nbytes);
	ck_assert(copy);
	memcpy(copy, big->data, big->nbytes);
	sl_st_release(big, 100, 2 * 4096 + 7);
	ck_assert(memcmp(copy, big->data, big->nbytes) == 0);
	sl_st_release(big, 0, big->nbytes);
	sl_st_release(big, big->nbytes, 4096);
	sl_st_release(big, big->nbytes - 1, (size_t)-1);
	ck_assert(memcmp(copy, big->data, big->nbytes) == 0);
	free(copy);
	sl_st_close(st);
}
END_TEST

/*
 * The reproduction, on a one-file checkpoint (opt-pre) and a sharded
 * bf16 one (opt-wide, the change in its second shard): weights on disk,
 * then the checkpoint's MLP weights zeroed in place.
 */
START_TEST(test_changed_checkpoint)
{
	const char *fx = _i == 0 ? "opt-pre" : "opt-wide";
	char ck[400], off[400];
	copy_fixture(fx, "ck", ck, sizeof ck);
	make_subdir("off", off, sizeof off);
	run_out ref0, ref1, ref2, a, b;
	ck_assert_int_eq(run(ck, fx, 100, 0, NULL, &ref0), 0);
	ck_assert_msg(run(ck, fx, 0, 0, off, &a) == 0, "%s", sl_errmsg());
	ck_assert_msg(a.disk_written > 0 && same(&a, &ref0), "the store is written and serves the weights");
	free(a.logits);
	ck_assert_int_eq(run(ck, fx, 0, 0, off, &a), 0);
	ck_assert_msg(a.disk_written == 0 && same(&a, &ref0), "a second run reuses the store");
	free(a.logits);

	/* the MLP weights zeroed in place: same size, same header */
	zero_tensor(ck, _i == 0 ? "layers.0.fc1.weight" : "layers.1.fc2.weight");
	ck_assert_int_eq(run(ck, fx, 100, 0, NULL, &ref1), 0);
	ck_assert_msg(!same(&ref1, &ref0), "zeroing the weights changes the logits");
	ck_assert_msg(run(ck, fx, 0, 0, off, &b) == 0, "%s", sl_errmsg());
	ck_assert_msg(same(&b, &ref1), "%s: the store served the weights from before the change", fx);
	ck_assert_msg(b.disk_written > 0, "the store was written again");
	ck_assert_msg(count_stores(off), "the old store was replaced, not kept beside the new one");
	free(b.logits);

	/* changed again, its modification time set back to what it was */
	times t0;
	times_get(ck, &t0);
	usleep(20 * 1000);
	zero_tensor(ck, _i == 0 ? "layers.1.fc2.weight" : "layers.0.fc1.weight");
	times_set(ck, &t0);
	ck_assert_int_eq(run(ck, fx, 100, 0, NULL, &ref2), 0);
	ck_assert_msg(!same(&ref2, &ref1), "zeroing more weights changes the logits");
	ck_assert_int_eq(run(ck, fx, 0, 0, off, &b), 0);
	ck_assert_msg(same(&b, &ref2), "%s: with the mtime set back, the store served old weights", fx);
	free(b.logits);
	ck_assert_int_eq(run(ck, fx, 0, 0, off, &b), 0);
	ck_assert_msg(b.disk_written == 0 && same(&b, &ref2), "then reused");
	free(b.logits);
	free(ref0.logits);
	free(ref1.logits);
	free(ref2.logits);
}
END_TEST

/* A model held open: its prefill logits on demand. */
typedef struct held {
	sl_backend *be;
	sl_model *m;
} held;

static void hold(const char *ckpt, double gpu, double cpu, const char *off, held *h)
{
	ck_assert_int_eq(sl_backend_create("cpu", 0, &h->be), 0);
	const sl_plan_params pp = weights_at(gpu, cpu, false);
	sl_model_params mp = { .dir = ckpt, .offload_dir = off, .plan = &pp };
	ck_assert_msg(sl_model_open_ex(h->be, &mp, &h->m) == 0, "%s", sl_errmsg());
}

static void held_logits(held *h, const char *fx, run_out *o)
{
	int np, plen[16];
	int32_t prompts[16][64];
	sl_test_prompts(fixtures_dir, fx, &np, plen, prompts);
	int t = 0;
	for (int i = 0; i < np; i++)
		t = SL_MAX(t, plen[i]);
	int32_t ids[16 * 64] = { 0 };
	int npad[16];
	for (int s = 0; s < np; s++) {
		npad[s] = t - plen[s];
		memcpy(ids + s * t + npad[s], prompts[s], sizeof(int32_t) * (size_t)plen[s]);
	}
	o->n = (size_t)np * t * h->m->cfg.vocab;
	o->logits = malloc(sizeof(float) * o->n);
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_create(&h->m->kv_env, np, t, &kv), 0);
	ck_assert_int_eq(sl_model_prefill(h->m, kv, ids, npad, t, o->logits), 0);
	sl_kv_free(kv);
}

static void unhold(held *h)
{
	sl_model_free(h->m);
	sl_backend_free(h->be);
}

/* A job still running on the old store when the checkpoint changes and
 * another job replaces the store: the first keeps its weights. */
START_TEST(test_replaced_while_open)
{
	char ck[400], off[400];
	copy_fixture("opt-pre", "ck", ck, sizeof ck);
	make_subdir("off", off, sizeof off);
	run_out ref0, ref1, a, b;
	ck_assert_int_eq(run(ck, "opt-pre", 100, 0, NULL, &ref0), 0);
	held h;
	hold(ck, 0, 0, off, &h);
	zero_tensor(ck, "layers.0.fc2.weight");
	ck_assert_int_eq(run(ck, "opt-pre", 100, 0, NULL, &ref1), 0);
	ck_assert_int_eq(run(ck, "opt-pre", 0, 0, off, &b), 0);
	ck_assert_msg(same(&b, &ref1) && b.disk_written > 0, "the new job gets the new weights");
	held_logits(&h, "opt-pre", &a);
	ck_assert_msg(same(&a, &ref0), "the job that was running keeps the weights it loaded");
	unhold(&h);
	free(a.logits);
	free(b.logits);
	free(ref0.logits);
	free(ref1.logits);
}
END_TEST

static bool file_exists(const char *dir, const char *name)
{
	char path[800];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

/* One folder, several placements and checkpoints: a store each, each reused;
 * the names say which. */
START_TEST(test_store_per_placement)
{
	char ck[400], ck2[400], off[400];
	copy_fixture("opt-pre", "ck", ck, sizeof ck);
	copy_fixture("opt-pre", "ck2", ck2, sizeof ck2);
	make_subdir("off", off, sizeof off);
	static const double pl[][2] = { { 0, 0 }, { 0, 40 }, { 30, 30 } };
	run_out ref, o;
	ck_assert_int_eq(run(ck, "opt-pre", 100, 0, NULL, &ref), 0);
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < 3; i++)
			for (int c = 0; c < 2; c++) {
				ck_assert_msg(run(c ? ck2 : ck, "opt-pre", pl[i][0], pl[i][1], off, &o) == 0, "%s",
					      sl_errmsg());
				ck_assert_msg(same(&o, &ref), "placement %g/%g", pl[i][0], pl[i][1]);
				ck_assert_msg((o.disk_written > 0) == (pass == 0),
					      "pass %d, placement %g/%g, checkpoint %d: written %llu bytes", pass,
					      pl[i][0], pl[i][1], c, (unsigned long long)o.disk_written);
				free(o.logits);
			}
	free(ref.logits);
	/* the names: model, source, placement */
	sl_model_config cfg;
	char cfgp[500], name[SL_WSTORE_NAME_MAX], name2[SL_WSTORE_NAME_MAX], key[SL_DISK_MAX_KEY + 1];
	snprintf(cfgp, sizeof cfgp, "%s/config.json", ck);
	ck_assert_int_eq(sl_model_config_load(cfgp, &cfg), 0);
	sl_st_set *st = NULL;
	ck_assert_int_eq(sl_st_open_dir(ck, &st), 0);
	ck_assert_int_eq(sl_wstore_ident(ck, st, &cfg, 0, 40, false, 0, 0, name, sizeof name, key, sizeof key), 0);
	sl_st_close(st);
	ck_assert_int_eq(sl_st_open_dir(ck2, &st), 0);
	ck_assert_int_eq(sl_wstore_ident(ck2, st, &cfg, 0, 40, false, 0, 0, name2, sizeof name2, key, sizeof key), 0);
	sl_st_close(st);
	ck_assert_msg(!strncmp(name, "ck.", 3) && strstr(name, ".w0-40.weights.sluice") && strlen(name) == 3 + 8 + 21,
		      "%s", name);
	ck_assert_msg(!strncmp(name2, "ck2.", 4) && strcmp(name + 3, name2 + 4), "%s %s", name, name2);
	ck_assert(file_exists(off, name) && file_exists(off, name2));
	ck_assert_int_eq(sl_model_config_named("opt-125m", &cfg), 0);
	ck_assert_int_eq(sl_wstore_ident(NULL, NULL, &cfg, 20, 30, false, 0, 0, name, sizeof name, key, sizeof key), 0);
	ck_assert_str_eq(name, "opt-125m.dummy.w20-30.weights.sluice");
	ck_assert_msg(strstr(key, "\"dummy\":\"opt-125m\"") && strstr(key, "\"gpu_percent\":20.0") &&
			      strstr(key, "\"layers\":12"),
		      "%s", key);
}
END_TEST

static const sl_wstore_entry *find_entry(const sl_wstore_entry *v, int n, const char *prefix)
{
	for (int i = 0; i < n; i++)
		if (!strncmp(v[i].name, prefix, strlen(prefix)))
			return &v[i];
	ck_abort_msg("no store named %s...", prefix);
	return NULL;
}

/* sl_wstore_list: current, stale (changed; gone), interrupted, foreign; in
 * use or not; and removing only what no job holds. */
START_TEST(test_list)
{
	char cur[400], chg[400], gone[400], off[400], cmd[900];
	copy_fixture("opt-pre", "cur", cur, sizeof cur);
	copy_fixture("opt-pre", "chg", chg, sizeof chg);
	copy_fixture("opt-pre", "gone", gone, sizeof gone);
	make_subdir("off", off, sizeof off);
	run_out o;
	const char *const dirs[] = { cur, chg, gone };
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(run(dirs[i], "opt-pre", 0, 30, off, &o), 0);
		free(o.logits);
	}
	zero_tensor(chg, "layers.0.fc1.weight");
	snprintf(cmd, sizeof cmd, "rm -r '%s'", gone);
	ck_assert_int_eq(system(cmd), 0);
	/* an interrupted store: opened under its key, never marked complete */
	sl_model_config cfg;
	char cfgp[500], name[SL_WSTORE_NAME_MAX], key[SL_DISK_MAX_KEY + 1];
	snprintf(cfgp, sizeof cfgp, "%s/config.json", cur);
	ck_assert_int_eq(sl_model_config_load(cfgp, &cfg), 0);
	sl_st_set *st = NULL;
	ck_assert_int_eq(sl_st_open_dir(cur, &st), 0);
	ck_assert_int_eq(sl_wstore_ident(cur, st, &cfg, 10, 0, false, 0, 0, name, sizeof name, key, sizeof key), 0);
	sl_st_close(st);
	sl_disk_params dp = { .dir = off, .file_name = name, .key = key, .data_bytes = 1 << 20 };
	sl_disk_store *ds = NULL;
	bool fresh;
	ck_assert_int_eq(sl_disk_open(&dp, &ds, &fresh), 0);
	sl_disk_close(ds);
	/* an earlier sluice's store, and a file that is no store at all */
	dp = (sl_disk_params){ .dir = off, .file_name = "opt.weights.sluice", .data_bytes = 4096,
			       .key = "sluice weights v2; model opt: layers 2; checkpoint /x (config mtime 1)" };
	ck_assert_int_eq(sl_disk_open(&dp, &ds, &fresh), 0);
	char *page = aligned_alloc(4096, 4096);
	memset(page, 1, 4096);
	uint64_t t;
	ck_assert(sl_disk_write(ds, 0, page, 4096, &t) == 0 && sl_disk_wait(ds, t) == 0);
	ck_assert_int_eq(sl_disk_mark_complete(ds), 0);
	sl_disk_close(ds);
	free(page);
	snprintf(cmd, sizeof cmd, "echo hello > '%s/junk.weights.sluice'; : > '%s/empty.weights.sluice'", off, off);
	ck_assert_int_eq(system(cmd), 0);

	held h;
	hold(cur, 0, 30, off, &h); /* a running job holds the current store */
	sl_wstore_entry *v = NULL;
	int n = 0;
	ck_assert_msg(sl_wstore_list(off, &v, &n) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(n, 7);
	const sl_wstore_entry *e = find_entry(v, n, "cur.");
	ck_assert_msg(strstr(e->name, ".w0-30.") && e->state == SL_WSTORE_CURRENT && e->in_use, "%s %s %d", e->name,
		      sl_wstore_state_name(e->state), e->in_use);
	ck_assert_msg(strstr(e->what, cur) && strstr(e->what, "0% device, 30% host, 70% disk"), "%s", e->what);
	e = find_entry(v, n, "chg.");
	ck_assert_msg(e->state == SL_WSTORE_STALE && !e->in_use && strstr(e->why, "weight files changed"), "%s: %s",
		      sl_wstore_state_name(e->state), e->why);
	e = find_entry(v, n, "gone.");
	ck_assert_msg(e->state == SL_WSTORE_STALE && strstr(e->why, "checkpoint cannot be read"), "%s", e->why);
	e = find_entry(v, n, name);
	ck_assert_msg(e->state == SL_WSTORE_INCOMPLETE && strstr(e->why, "interrupted"), "%s", e->why);
	e = find_entry(v, n, "opt.weights");
	ck_assert_msg(e->state == SL_WSTORE_FOREIGN && e->ours && strstr(e->why, "earlier version"), "%s", e->why);
	e = find_entry(v, n, "junk.");
	ck_assert_msg(e->state == SL_WSTORE_FOREIGN && !e->ours && strstr(e->why, "not a sluice store"), "%s", e->why);
	e = find_entry(v, n, "empty.");
	ck_assert_msg(e->state == SL_WSTORE_FOREIGN && e->ours, "an empty file where a store was being created: %s",
		      e->why);

	/* removal leaves a held store alone */
	char path[900];
	bool removed = true;
	snprintf(path, sizeof path, "%s/%s", off, find_entry(v, n, "cur.")->name);
	ck_assert_int_eq(sl_disk_remove_unused(path, &removed), 0);
	ck_assert_msg(!removed && access(path, F_OK) == 0, "a store a job holds is kept");
	unhold(&h);
	ck_assert_int_eq(sl_disk_remove_unused(path, &removed), 0);
	ck_assert_msg(removed && access(path, F_OK) != 0, "removed once released");
	snprintf(path, sizeof path, "%s/%s", off, find_entry(v, n, "chg.")->name);
	ck_assert_int_eq(sl_disk_remove_unused(path, &removed), 0);
	ck_assert(removed && access(path, F_OK) != 0);
	free(v);
}
END_TEST

/* Logits of two short prompts on the dummy opt-125m, weights placed gpu/cpu
 * (the rest in off), under a host budget; also the host peak. */
static int run_dummy(double gpu, double cpu, const char *off, size_t host_mem, run_out *o, size_t *host_peak)
{
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
	sl_backend_set_host_limit(be, host_mem);
	const sl_plan_params pp = weights_at(gpu, cpu, true);
	sl_model_params mp = { .dummy = "opt-125m", .offload_dir = off, .plan = &pp };
	sl_model *m = NULL;
	int rc = sl_model_open_ex(be, &mp, &m);
	if (rc == 0) {
		const int32_t ids[2 * 4] = { 2, 100, 200, 300, 2, 7, 7, 50000 };
		const int npad[2] = { 0, 0 };
		o->n = (size_t)2 * 4 * m->cfg.vocab;
		o->logits = malloc(sizeof(float) * o->n);
		sl_kv *kv = NULL;
		ck_assert_int_eq(sl_kv_create(&m->kv_env, 2, 4, &kv), 0);
		ck_assert_int_eq(sl_model_prefill(m, kv, ids, npad, 4, o->logits), 0);
		sl_kv_free(kv);
		o->disk_written = m->w.stats.disk_write_bytes;
		o->plan = m->plan;
	}
	if (host_peak)
		*host_peak = be->host_peak;
	sl_model_free(m);
	sl_backend_free(be);
	return rc;
}

/*
 * Loading converts in two bounded buffers: opt-125m with everything on the
 * device loads under --cpu-mem 64M (its embeddings alone are 77 MiB), its
 * pinned peak is those buffers (8 MiB), and a budget one byte smaller is
 * refused.  Conversion in small pieces (tensors, disk windows and the
 * tied-head check cut everywhere) loads the same weights as the default
 * pieces: dummy, a one-file checkpoint, a sharded bf16 one and a post-LN
 * one with projections.
 */
START_TEST(test_bounded_conversion)
{
	sl_model_config cfg;
	ck_assert_int_eq(sl_model_config_named("opt-125m", &cfg), 0);
	const size_t conv = sl_weights_convert_bytes(&cfg, 100, 0, false);
	ck_assert_uint_eq(conv, (size_t)8 << 20);
	run_out ref, o;
	size_t peak = 0;
	ck_assert_msg(run_dummy(100, 0, NULL, (size_t)64 << 20, &ref, &peak) == 0, "--cpu-mem 64M: %s", sl_errmsg());
	ck_assert_uint_eq(peak, conv);
	ck_assert_msg(run_dummy(100, 0, NULL, conv, &o, &peak) == 0, "%s", sl_errmsg());
	ck_assert_msg(same(&o, &ref), "the same weights under the smallest budget");
	free(o.logits);
	ck_assert_int_eq(run_dummy(100, 0, NULL, conv - 1, &o, NULL), SL_EBUDGET);
	ck_assert_msg(strstr(sl_errmsg(), "weight conversion"), "%s", sl_errmsg());

	/* small pieces (16 KiB; a page for the checkpoints): the same weights,
	 * on the device and on disk */
	char off[400];
	make_subdir("off", off, sizeof off);
	setenv("SLUICE_CONVERT_PIECE", "16384", 1);
	ck_assert_int_eq(run_dummy(100, 0, NULL, 0, &o, NULL), 0);
	ck_assert_msg(same(&o, &ref), "dummy weights converted 16 KiB at a time");
	free(o.logits);
	ck_assert_int_eq(run_dummy(0, 70, off, 0, &o, NULL), 0);
	ck_assert_msg(o.disk_written > 0 && same(&o, &ref), "dummy weights on disk written 16 KiB at a time");
	free(o.logits);
	free(ref.logits);
	static const char *const fx[] = { "opt-pre", "opt-wide", "opt-post" };
	for (size_t f = 0; f < SL_ARRAY_LEN(fx); f++) {
		char dir[600], sub[600];
		snprintf(dir, sizeof dir, "%s/%s", fixtures_dir, fx[f]);
		snprintf(sub, sizeof sub, "%s/%s", off, fx[f]);
		ck_assert_int_eq(mkdir(sub, 0755), 0);
		unsetenv("SLUICE_CONVERT_PIECE");
		ck_assert_int_eq(run(dir, fx[f], 100, 0, NULL, &ref), 0);
		setenv("SLUICE_CONVERT_PIECE", "4096", 1);
		ck_assert_int_eq(run(dir, fx[f], 100, 0, NULL, &o), 0);
		ck_assert_msg(same(&o, &ref), "%s converted a page at a time", fx[f]);
		free(o.logits);
		ck_assert_int_eq(run(dir, fx[f], 0, 30, sub, &o), 0);
		ck_assert_msg(o.disk_written > 0 && same(&o, &ref), "%s on disk written a page at a time", fx[f]);
		free(o.logits);
		free(ref.logits);
	}
}
END_TEST

/*
 * A zstd store's frame buffers count in the host budget: opt-125m with 70%
 * of its layers on disk, read from a store sluice convert --zstd wrote,
 * holds exactly what its plan says in pinned host memory (the plain
 * store's plus each staging slot's compressed frames and a window of
 * scratch per decompression thread, sl_wstage_zstd_bytes), the plan knows
 * the store's ratio and window, the weights read are the plain store's,
 * and a host budget of one byte less than the peak is refused.
 */
START_TEST(test_zstd_host_budget)
{
	char off[400], zoff[400], path[900];
	make_subdir("off", off, sizeof off);
	make_subdir("zoff", zoff, sizeof zoff);
	run_out plain, z, o;
	size_t plain_peak = 0, zpeak = 0;
	ck_assert_msg(run_dummy(0, 30, off, 0, &plain, &plain_peak) == 0, "%s", sl_errmsg());
	ck_assert(plain.plan.p.w_zstd == 0 && plain_peak == plain.plan.total.host);

	sl_backend *be = NULL;
	bool written = false;
	ck_assert_int_eq(sl_backend_create("cpu", 0, &be), 0);
	ck_assert_msg(sl_wstore_convert(be, NULL, "opt-125m", 0, 30, false, 1, zoff, path, sizeof path, &written) == 0,
		      "%s", sl_errmsg());
	sl_backend_free(be);
	ck_assert(written);
	ck_assert_msg(run_dummy(0, 30, zoff, 0, &z, &zpeak) == 0, "%s", sl_errmsg());
	ck_assert_msg(same(&z, &plain), "the zstd store's weights are the plain store's");
	sl_model_config cfg;
	ck_assert_int_eq(sl_model_config_named("opt-125m", &cfg), 0);
	const uint32_t window = sl_weights_zstd_window(&cfg, 0, 30, false);
	ck_assert_msg(z.plan.p.w_zstd > 0 && z.plan.p.w_zstd < 1 && z.plan.p.w_zstd_window == window,
		      "the plan's ratio %g, window %u (%u)", z.plan.p.w_zstd, z.plan.p.w_zstd_window, window);
	ck_assert_msg(zpeak == z.plan.total.host, "host: plan %zu, peak %zu", z.plan.total.host, zpeak);
	const size_t disk = sl_weights_disk_bytes(&cfg, 0, 30, false);
	const size_t frames = 2 * disk + (size_t)sl_wstage_zstd_threads() * window;
	ck_assert_msg(z.plan.weights.host == plain.plan.weights.host + frames,
		      "the zstd buffers: %zu more host bytes, expected %zu",
		      z.plan.weights.host - plain.plan.weights.host, frames);
	free(plain.logits);

	/* the sizes the plan states are the smallest budget, to the byte */
	ck_assert_msg(run_dummy(0, 30, zoff, zpeak, &o, NULL) == 0, "%s", sl_errmsg());
	ck_assert(same(&o, &z));
	free(o.logits);
	free(z.logits);
	ck_assert_int_eq(run_dummy(0, 30, zoff, zpeak - 1, &o, NULL), SL_EBUDGET);

	/* the store is found without opening the model, quietly */
	const sl_plan_params pp = weights_at(0, 30, true);
	sl_model_params mp = { .dummy = "opt-125m", .offload_dir = zoff, .plan = &pp };
	sl_wstore_zstd found;
	ck_assert_int_eq(sl_model_find_zstd(&mp, &found), 0);
	ck_assert(found.level == 1 && found.window == window && found.ratio == z.plan.p.w_zstd);
	mp.offload_dir = off;
	ck_assert_int_eq(sl_model_find_zstd(&mp, &found), 0);
	ck_assert_int_eq(found.level, 0);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	/* the direct GEMM kernel for every row count: placement-invariant sums */
	setenv("SLUICE_GEMM_SMALL_M", "1000000", 1);
	Suite *s = suite_create("wstore");
	TCase *tc = tcase_create("store");
	tcase_add_checked_fixture(tc, make_tmp, rm_tmp);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_fnv1a64_reference);
	tcase_add_test(tc, test_header_hash_pinned);
	tcase_add_test(tc, test_release_keeps_contents);
	tcase_add_loop_test(tc, test_changed_checkpoint, 0, 2);
	tcase_add_test(tc, test_replaced_while_open);
	tcase_add_test(tc, test_store_per_placement);
	tcase_add_test(tc, test_list);
	tcase_add_test(tc, test_bounded_conversion);
	tcase_add_test(tc, test_zstd_host_budget);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
