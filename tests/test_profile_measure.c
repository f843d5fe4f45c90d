/*
 * test_profile_measure.c - measuring a profile (runtime/profile_measure.h)
 * on the CPU backend, quick sizes, and the cached profile that
 * sl_profile_obtain keeps per machine and build.
 *
 * What a user (the cost model, `sluice policy`) relies on:
 *  - a measured profile holds every format 2 rate: the GEMM curve at
 *    increasing m, the copy and op latencies, both attention rates, the
 *    disk's write rate where an offload directory is given (null without)
 *    and its patterns (sustained passes, the segment curve, page writes,
 *    the overlap with GEMMs),
 *    the backend's reserve (0 on the CPU backend), the build and the
 *    machine key; on the CPU backend the CPU's rates are the backend's
 *    (cpu_attn_gbps = attn_decode_gbps, cpu_gemm_gflops = the curve's
 *    point, copy_gbps = h2d_gbps, d2h measured);
 *  - sl_profile_obtain measures once and then reuses the file while the
 *    machine key matches: the second call does not measure and does not
 *    rewrite the file; another thread count, a file of another machine,
 *    a foreign or unreadable file are measured again (not an error); a
 *    cache that cannot be written still gives the profile, with a flag;
 *    without a folder it goes to $XDG_CACHE_HOME/sluice, created.
 */
#include "profile_measure.h"
#include "sl_common.h"
#include "sl_config.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/sl_profm_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "chmod -R u+w %s; rm -rf %s", tmpdir, tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

static sl_profile_opts quick_opts(int threads, const char *offload)
{
	return (sl_profile_opts){ .backend = "cpu", .threads = threads, .quick = true, .offload_dir = offload };
}

static void check_model_name(const char *key)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10))
			continue;
		char *v = strchr(line, ':') + 2;
		v[strcspn(v, "\n")] = 0;
		ck_assert_msg(strstr(key, v), "the key '%s' names the CPU '%s'", key, v);
		break;
	}
	fclose(f);
}

/* the GEMM curve: npoints rows, every power of two from 1, on n = k = nk,
 * each measured */
static void check_curve(const sl_profile_curve *c, int npoints, int nk)
{
	ck_assert_int_eq(c->npoints, npoints);
	ck_assert_int_eq(c->n, nk);
	ck_assert_int_eq(c->k, nk);
	for (int i = 0; i < c->npoints; i++) {
		ck_assert_int_eq(c->m[i], 1 << i);
		ck_assert_msg(c->gflops[i] > 0, "gemm at m=%d: %g", c->m[i], c->gflops[i]);
	}
}

START_TEST(test_measure)
{
	make_tmpdir();
	sl_profile *p = malloc(sizeof *p);
	sl_profile_opts o = quick_opts(2, tmpdir);
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(p->backend, "cpu");
	const sl_profile_curve *c = &p->gemm;
	check_curve(c, 7, 256);
	ck_assert_msg(p->cpu_gemm_gflops == c->gflops[6] && p->cpu_gemm_m == 64, "cpu_gemm is the curve's m=64");
	/* the set of weights the cache keeps: none measured (the hot curve
	 * gains under 10% at 1 row), or 1 to 32 copies of the curve's 128 KiB
	 * matrix, no more than hwloc's cache */
	const uint64_t mat = 256 * 256 * sizeof(sl_half);
	ck_assert_msg(p->llc_hot_bytes == 0 ||
			      (p->llc_hot_bytes % mat == 0 && p->llc_hot_bytes >= mat && p->llc_hot_bytes <= 32 * mat &&
			       (p->llc_bytes == 0 || p->llc_hot_bytes <= SL_MAX(p->llc_bytes, mat))),
		      "llc_hot_bytes %llu (llc %llu)", (unsigned long long)p->llc_hot_bytes,
		      (unsigned long long)p->llc_bytes);
	ck_assert_msg(p->copy_gbps > 0 && p->copy_gbps == p->h2d_gbps, "copy_gbps %g = h2d %g", p->copy_gbps,
		      p->h2d_gbps);
	ck_assert_msg(p->d2h_gbps > 0, "d2h measured on the CPU backend");
	ck_assert_msg(p->copy_bytes == 8u << 20, "copies of %llu bytes", (unsigned long long)p->copy_bytes);
	ck_assert_msg(p->copy_latency_us > 0 && p->op_latency_us > 0, "latencies %g %g", p->copy_latency_us,
		      p->op_latency_us);
	ck_assert_msg(p->attn_decode_gbps > 0 && p->attn_prefill_gflops > 0, "attention %g %g", p->attn_decode_gbps,
		      p->attn_prefill_gflops);
	ck_assert_msg(p->cpu_attn_gbps == p->attn_decode_gbps, "cpu_attn is the backend's decode attention");
	ck_assert_msg(p->disk_write_gbps > 0 && p->disk_read_gbps > 0, "disk %g %g", p->disk_write_gbps,
		      p->disk_read_gbps);
	/* the disk as the stores use it (quick: parts of 2 MiB, so the
	 * segment sizes up to 1 MiB): three passes, their spread, the curve,
	 * the page writes, and on the CPU backend the overlap with GEMMs */
	ck_assert_int_eq(p->disk_passes, 3);
	ck_assert_msg(p->disk_read_spread >= 0, "spread %g", p->disk_read_spread);
	ck_assert_uint_eq(p->disk_bytes, 3 * (2u << 20)); /* a part per pattern */
	ck_assert_int_eq(p->disk_seg.npoints, 2);
	ck_assert_int_eq(p->disk_seg.outstanding, 2);
	ck_assert_uint_eq(p->disk_seg.bytes[0], 256 * 1024);
	ck_assert_uint_eq(p->disk_seg.bytes[1], 1u << 20);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(p->disk_seg.gbps[i] > 0 && p->disk_seg.spread[i] >= 0, "segment reads %g (%g)",
			      p->disk_seg.gbps[i], p->disk_seg.spread[i]);
	ck_assert_msg(p->disk_page_write_gbps > 0, "page writes %g", p->disk_page_write_gbps);
	ck_assert_msg(p->have_disk_overlap && p->disk_overlap >= 0 && p->disk_overlap <= 1, "disk overlap %g",
		      p->disk_overlap);
	ck_assert_msg(p->dev_reserve_bytes == 0, "the CPU backend reserves %llu bytes",
		      (unsigned long long)p->dev_reserve_bytes);
	/* the build is the version and the commit: a rebuilt sluice of
	 * another commit does not reuse this machine's cached profile */
	char build[128], want_key[192];
	snprintf(build, sizeof build, "%s+%s", SL_VERSION, sl_build_id);
	ck_assert_str_eq(p->build, build);
	ck_assert(sl_build_id[0] != 0);
	/* zstd frames of normal fp16 values: decompressed, and smaller (the
	 * sign and exponent bytes, shuffled together, compress) */
	ck_assert_msg(p->zstd_gbps > 0, "zstd %g GB/s", p->zstd_gbps);
	ck_assert_msg(p->zstd_ratio > 0.5 && p->zstd_ratio < 0.95, "zstd ratio %g", p->zstd_ratio);
	/* the load it was measured at, from /proc/loadavg */
	ck_assert_msg(p->load_average >= 0, "load %g", p->load_average);
	snprintf(want_key, sizeof want_key, "backend=cpu; threads=2; cpu_gemm=sluice; build=%s; cpu=", build);
	ck_assert_msg(strstr(p->machine, want_key), "key '%s'", p->machine);
	check_model_name(p->machine);
	ck_assert_msg(strstr(p->machine, "; gpu=none"), "key '%s'", p->machine);

	/* no offload directory: the disk's rates are not measured (null) */
	o.offload_dir = NULL;
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert(p->disk_write_gbps == 0 && p->disk_read_gbps == 0 && p->disk_engine[0] == 0);
	ck_assert(p->disk_passes == 0 && p->disk_seg.npoints == 0 && p->disk_page_write_gbps == 0 &&
		  !p->have_disk_overlap);
	free(p);
	remove_tmpdir();
}
END_TEST

/*
 * A full profile (not quick) as `sluice profile --dummy NAME` runs one, but
 * without the disk and with one small shape: the curve at every power of
 * two from 1 to 1024 rows on n = k = 2048, and the shape at 1, 2, 4, 8,
 * 16, 32, 64 and 512 rows (the README's lists).
 */
START_TEST(test_measure_full_shapes)
{
	sl_profile *p = malloc(sizeof *p);
	sl_profile_opts o = { .backend = "cpu", .threads = 2, .nshapes = 1, .shapes = { { 96, 64 } } };
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert(!p->quick);
	check_curve(&p->gemm, 11, 2048);
	ck_assert_int_eq(p->cpu_gemm_m, 512);
	static const int want[] = { 1, 2, 4, 8, 16, 32, 64, 512 };
	ck_assert_int_eq(p->n_gemm_shapes, 1);
	const sl_profile_curve *s = &p->gemm_shapes[0];
	ck_assert_int_eq(s->n, 96);
	ck_assert_int_eq(s->k, 64);
	ck_assert_int_eq(s->npoints, (int)SL_ARRAY_LEN(want));
	for (int i = 0; i < s->npoints; i++) {
		ck_assert_int_eq(s->m[i], want[i]);
		ck_assert_msg(s->gflops[i] > 0, "shape at m=%d: %g", s->m[i], s->gflops[i]);
	}
	free(p);
}
END_TEST

/* ---- the cache ---------------------------------------------------------------------- */

static ino_t inode_of(const char *path)
{
	struct stat st;
	ck_assert_msg(stat(path, &st) == 0, "%s exists", path);
	return st.st_ino;
}

/* sl_profile_obtain, *measured flipped first: the call must set it */
static int obtain(const sl_profile_opts *o, const char *dir, sl_profile *p, bool *measured)
{
	*measured = !*measured;
	return sl_profile_obtain(o, dir, p, measured);
}

START_TEST(test_cache)
{
	make_tmpdir();
	char dir[128], path[192];
	snprintf(dir, sizeof dir, "%s/cache/sub", tmpdir); /* created */
	snprintf(path, sizeof path, "%s/sluice-profile-cpu.json", dir);
	sl_profile *a = malloc(sizeof *a), *b = malloc(sizeof *b), *f = malloc(sizeof *f);
	sl_profile_opts o = quick_opts(2, NULL);
	bool m = false;

	/* cache_only: nothing cached yet is SL_ENOTFOUND, nothing measured
	 * and no folder made */
	o.cache_only = true;
	ck_assert_msg(obtain(&o, dir, a, &m) == SL_ENOTFOUND && !m, "cache_only measured: %s", sl_errmsg());
	struct stat st;
	ck_assert_msg(stat(dir, &st) != 0, "cache_only made %s", dir);
	o.cache_only = false;

	ck_assert_msg(obtain(&o, dir, a, &m) == 0, "%s", sl_errmsg());
	ck_assert_msg(m, "the first call measures");
	ck_assert_msg(sl_profile_load(path, f) == 0, "the cache holds it: %s", sl_errmsg());
	ck_assert_mem_eq(f->machine, a->machine, sizeof a->machine);
	ck_assert(f->seconds == a->seconds);
	const ino_t ino = inode_of(path);

	/* the same machine and build: reused, the file untouched */
	ck_assert_msg(obtain(&o, dir, b, &m) == 0, "%s", sl_errmsg());
	ck_assert_msg(!m, "the second call does not measure");
	ck_assert_msg(b->seconds == a->seconds && b->gemm.gflops[3] == a->gemm.gflops[3] &&
			      b->attn_decode_gbps == a->attn_decode_gbps,
		      "the cached profile");
	ck_assert_msg(inode_of(path) == ino, "the cache was not rewritten");
	o.cache_only = true; /* and a cache-only look finds it */
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && !m && b->seconds == a->seconds, "%s", sl_errmsg());
	o.cache_only = false;

	/* another key (threads): measured again, and cached in its place */
	o.threads = 1;
	ck_assert_msg(obtain(&o, dir, b, &m) == 0, "%s", sl_errmsg());
	ck_assert_msg(m, "another thread count measures");
	ck_assert_msg(strstr(b->machine, "threads=1;"), "%s", b->machine);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && !m, "then reused");

	/* a file of another machine (its key edited): measured again */
	json_t *j = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(j);
	json_object_set_new(j, "machine", json_string("backend=cpu; threads=1; build=" SL_VERSION
						      "; cpu=Another CPU; pus=2; gpu=none"));
	ck_assert_int_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
	json_decref(j);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "another machine's profile is measured again");
	ck_assert_msg(sl_profile_load(path, f) == 0 && !strcmp(f->machine, b->machine), "and replaced");

	/* a profile of another CPU GEMM (--cpu-gemm bf16): measured again */
	char key[sizeof b->machine + 16];
	j = json_load_file(path, 0, NULL);
	snprintf(key, sizeof key, "%s", b->machine);
	char *gv = strstr(key, "cpu_gemm=sluice;");
	ck_assert_msg(gv, "%s", b->machine);
	memmove(gv + strlen("cpu_gemm=bf16;"), gv + strlen("cpu_gemm=sluice;"), strlen(gv + strlen("cpu_gemm=sluice;")) + 1);
	memcpy(gv, "cpu_gemm=bf16;", strlen("cpu_gemm=bf16;"));
	json_object_set_new(j, "machine", json_string(key));
	ck_assert_int_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
	json_decref(j);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "another GEMM's profile is measured again");

	/* another build's file: measured again */
	j = json_load_file(path, 0, NULL);
	snprintf(key, sizeof key, "%s", b->machine);
	char *bv = strstr(key, "build=");
	ck_assert_ptr_nonnull(bv);
	memcpy(bv, "build=9", 7); /* another version */
	ck_assert(strcmp(key, b->machine) != 0);
	json_object_set_new(j, "machine", json_string(key));
	ck_assert_int_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
	json_decref(j);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "another build's profile is measured again");

	/* the same version built from other code (another commit, or other
	 * changes not committed: tools/build_id.sh): measured again */
	j = json_load_file(path, 0, NULL);
	snprintf(key, sizeof key, "%s", b->machine);
	char other[sizeof key + 32];
	bv = strstr(key, "+");
	ck_assert_ptr_nonnull(bv);
	ck_assert(!strncmp(bv + 1, sl_build_id, strlen(sl_build_id)));
	*bv = 0;
	snprintf(other, sizeof other, "%s+0123456789ab-dirty-0123456789ab%s", key, bv + 1 + strlen(sl_build_id));
	ck_assert(strcmp(other, b->machine) != 0 && strstr(other, "build=" SL_VERSION "+0123456789ab-dirty-"));
	json_object_set_new(j, "machine", json_string(other));
	ck_assert_int_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
	json_decref(j);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "another build id's profile is measured again");
	ck_assert_msg(sl_profile_load(path, f) == 0 && !strcmp(f->machine, b->machine), "and replaced");
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && !m, "then reused");

	/* a full profile is not a quick one (nor the reverse) */
	j = json_load_file(path, 0, NULL);
	json_object_set_new(j, "quick", json_false());
	ck_assert_int_eq(json_dump_file(j, path, JSON_INDENT(2)), 0);
	json_decref(j);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "a full profile in the cache is not a quick one");

	/* not a profile, or not JSON: measured again, not an error */
	FILE *fp = fopen(path, "w");
	fputs("{ \"format\": \"sluice-profile\", oops", fp);
	fclose(fp);
	ck_assert_msg(obtain(&o, dir, b, &m) == 0 && m, "a broken cache file: %s", sl_errmsg());
	ck_assert_msg(sl_profile_load(path, f) == 0, "replaced by a good one: %s", sl_errmsg());

	/* a cache that cannot be written: the profile all the same, flagged */
	if (geteuid() != 0) {
		ck_assert_int_eq(unlink(path), 0);
		ck_assert_int_eq(chmod(dir, 0500), 0);
		const int rc = obtain(&o, dir, b, &m);
		ck_assert_msg(rc == SL_PROFILE_NOT_CACHED && m, "rc %d: %s", rc, sl_errmsg());
		ck_assert_msg(strstr(sl_errmsg(), "the profile was not cached") && strstr(sl_errmsg(), dir),
			      "the message '%s' says so", sl_errmsg());
		ck_assert(b->gemm.npoints == 7 && b->attn_decode_gbps > 0);
		ck_assert_int_eq(chmod(dir, 0700), 0);
	}

	/* no folder: $XDG_CACHE_HOME/sluice, created */
	char xdg[128], xpath[192];
	snprintf(xdg, sizeof xdg, "%s/xdg/cache", tmpdir);
	snprintf(xpath, sizeof xpath, "%s/sluice/sluice-profile-cpu.json", xdg);
	setenv("XDG_CACHE_HOME", xdg, 1);
	ck_assert_msg(obtain(&o, NULL, b, &m) == 0 && m, "%s", sl_errmsg());
	ck_assert_msg(sl_profile_load(xpath, f) == 0, "cached in %s: %s", xpath, sl_errmsg());
	ck_assert_msg(obtain(&o, NULL, b, &m) == 0 && !m, "and reused");

	/* an offload directory is the cache's folder; its profile has the disk */
	char off[128], opath[192];
	snprintf(off, sizeof off, "%s/off", tmpdir);
	ck_assert_int_eq(mkdir(off, 0700), 0);
	snprintf(opath, sizeof opath, "%s/sluice-profile-cpu.json", off);
	o.offload_dir = off;
	ck_assert_msg(obtain(&o, NULL, b, &m) == 0 && m, "%s", sl_errmsg());
	ck_assert_msg(b->disk_write_gbps > 0, "the disk measured");
	ck_assert_msg(sl_profile_load(opath, f) == 0 && f->disk_write_gbps == b->disk_write_gbps, "cached in %s",
		      off);
	ck_assert_msg(obtain(&o, NULL, b, &m) == 0 && !m, "and reused");
	unsetenv("XDG_CACHE_HOME");
	free(a);
	free(b);
	free(f);
	remove_tmpdir();
}
END_TEST

static Suite *profile_measure_suite(void)
{
	Suite *s = suite_create("profile_measure");
	TCase *tc = tcase_create("profile_measure");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_measure);
	tcase_add_test(tc, test_measure_full_shapes);
	tcase_add_test(tc, test_cache);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(profile_measure_suite());
}
