/*
 * test_profile_emu.c - `sluice profile` on the CUDA backend's own code, run
 * on the CPU emulation of CUDA (kernels/cuda/emu): the path a GPU takes,
 * checked on machines without one.  Quick sizes.
 *
 * What the cost model relies on in a CUDA profile: the GEMM curve is the
 * device's (n = k = 1024 quick), the CPU's decode attention is measured
 * beside it on the CPU backend, copy_gbps is the pinned h2d rate, and
 * dev_reserve_bytes holds the compute queue's own workspaces: at least
 * the cuBLAS workspace (32 MiB on the emulated compute capability 9.0)
 * and at most what kernels/cuda/README.md says a queue holds (32 + 64 +
 * 64 + 1 MiB).
 */
#include "profile_measure.h"
#include "sl_common.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

START_TEST(test_cuda_profile)
{
	sl_profile *p = malloc(sizeof *p);
	const sl_profile_opts o = { .backend = "cuda", .threads = 2, .quick = true, .log = stderr };
	ck_assert_msg(sl_profile_run(&o, p) == 0, "%s", sl_errmsg());
	ck_assert_str_eq(p->backend, "cuda");
	ck_assert(p->have_gpu);
	ck_assert_msg(strstr(p->machine, "backend=cuda; threads=2;") && strstr(p->machine, "; gpu=emulated GPU"),
		      "key '%s'", p->machine);
	const sl_profile_curve *c = &p->gemm;
	ck_assert_int_eq(c->npoints, 7);
	ck_assert(c->n == 1024 && c->k == 1024);
	for (int i = 0; i < c->npoints; i++)
		ck_assert_msg(c->m[i] == 1 << i && c->gflops[i] > 0, "m=%d: %g", c->m[i], c->gflops[i]);
	ck_assert_msg(p->cpu_gemm_gflops > 0 && p->gpu_gemm_tflops > 0, "%g %g", p->cpu_gemm_gflops,
		      p->gpu_gemm_tflops);
	ck_assert_msg(p->attn_decode_gbps > 0 && p->attn_prefill_gflops > 0 && p->cpu_attn_gbps > 0, "%g %g %g",
		      p->attn_decode_gbps, p->attn_prefill_gflops, p->cpu_attn_gbps);
	ck_assert_msg(p->copy_gbps > 0 && p->copy_gbps == p->h2d_gbps && p->d2h_gbps > 0, "%g %g %g", p->copy_gbps,
		      p->h2d_gbps, p->d2h_gbps);
	ck_assert_msg(p->copy_latency_us > 0 && p->op_latency_us > 0, "%g %g", p->copy_latency_us,
		      p->op_latency_us);
	ck_assert_msg(p->dev_reserve_bytes >= 32 * MIB && p->dev_reserve_bytes <= (32 + 64 + 64 + 1) * MIB,
		      "dev_reserve_bytes %llu", (unsigned long long)p->dev_reserve_bytes);
	ck_assert(p->disk_write_gbps == 0 && p->disk_read_gbps == 0);
	free(p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("profile_emu");
	TCase *tc = tcase_create("profile_emu");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_cuda_profile);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	const int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
