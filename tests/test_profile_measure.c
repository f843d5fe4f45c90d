/*
 * test_profile_measure.c - measuring a profile (runtime/profile_measure.h)
 * on the CPU backend, quick sizes.
 *
 * What a user (the cost model, `sluice policy`) relies on:
 *  - a measured profile holds every format 2 rate: the GEMM curve at
 *    increasing m, the copy and op latencies, both attention rates, the
 *    disk's write rate where an offload directory is given (null without),
 *    the backend's reserve (0 on the CPU backend), the build and the
 *    machine key; on the CPU backend the CPU's rates are the backend's
 *    (cpu_attn_gbps = attn_decode_gbps, cpu_gemm_gflops = the curve's
 *    point, copy_gbps = h2d_gbps, d2h measured).
 */
#include "profile_measure.h"
#include "sl_common.h"
#include "sl_config.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
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

START_TEST(test_measure)
{
	make_tmpdir();
	sl_profile *p = malloc(sizeof *p);
	sl_profile_opts o = quick_opts(2, tmpdir);
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(p->backend, "cpu");
	const sl_profile_curve *c = &p->gemm;
	ck_assert_int_eq(c->npoints, 7);
	ck_assert_int_eq(c->n, 256);
	ck_assert_int_eq(c->k, 256);
	for (int i = 0; i < c->npoints; i++) {
		ck_assert_int_eq(c->m[i], 1 << i);
		ck_assert_msg(c->gflops[i] > 0, "gemm at m=%d: %g", c->m[i], c->gflops[i]);
	}
	ck_assert_msg(p->cpu_gemm_gflops == c->gflops[6] && p->cpu_gemm_m == 64, "cpu_gemm is the curve's m=64");
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
	ck_assert_msg(p->dev_reserve_bytes == 0, "the CPU backend reserves %llu bytes",
		      (unsigned long long)p->dev_reserve_bytes);
	ck_assert_str_eq(p->build, SL_VERSION);
	ck_assert_msg(strstr(p->machine, "backend=cpu; threads=2; build=" SL_VERSION "; cpu="), "key '%s'",
		      p->machine);
	check_model_name(p->machine);
	ck_assert_msg(strstr(p->machine, "; gpu=none"), "key '%s'", p->machine);

	/* no offload directory: the disk's rates are not measured (null) */
	o.offload_dir = NULL;
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert(p->disk_write_gbps == 0 && p->disk_read_gbps == 0 && p->disk_engine[0] == 0);
	free(p);
	remove_tmpdir();
}
END_TEST

static Suite *profile_measure_suite(void)
{
	Suite *s = suite_create("profile_measure");
	TCase *tc = tcase_create("profile_measure");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_measure);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(profile_measure_suite());
}
