/*
 * test_cost.c - the cost model (runtime/cost.h) and the policy search
 * (runtime/search.h).
 *
 * - A hand-worked case: a small shape whose every FLOP and byte is
 *   computed here from the model's definition, with round rates.
 * - The bytes the model says each link moves equal the bytes the runtime
 *   counts moving, phase by phase, over a grid of placements (weights,
 *   cache and activations in every tier, H2O, micro-batches, sep_layer).
 * - The search: what it picks fits the budgets, is the best of what it
 *   evaluated, honours --fix, and refuses budgets nothing fits with the
 *   smallest device budget that does, which then fits.
 */
#include "cost.h"
#include "model.h"
#include "search.h"
#include "sl_common.h"
#include "testutil.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fixtures_dir = "tests/fixtures";
static char offdir[256];

static void make_offdir(void)
{
	snprintf(offdir, sizeof offdir, "/tmp/sl_test_cost_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(offdir));
}

static void rm_offdir(void)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", offdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* A profile of round rates on the CPU backend (or a GPU's). */
static sl_profile round_profile(bool cpu)
{
	sl_profile p;
	memset(&p, 0, sizeof p);
	snprintf(p.backend, sizeof p.backend, "%s", cpu ? "cpu" : "cuda");
	p.mem_read_gbps = 10;
	p.cpu_gemm_gflops = 100;
	p.gpu_gemm_tflops = 100;
	p.gemm.npoints = 2;
	p.gemm.n = p.gemm.k = 256;
	p.gemm.m[0] = 1;
	p.gemm.gflops[0] = 1;
	p.gemm.m[1] = 1024;
	p.gemm.gflops[1] = 1024; /* 1 GFLOP/s per row of M: the time of M rows is flat */
	p.copy_gbps = p.h2d_gbps = p.d2h_gbps = 2;
	p.copy_latency_us = 1;
	p.op_latency_us = 1;
	p.attn_decode_gbps = 4;
	p.attn_prefill_gflops = 8;
	p.cpu_attn_gbps = 4;
	p.disk_read_gbps = 1;
	p.disk_write_gbps = 0.5;
	p.dev_reserve_bytes = cpu ? 0 : 1 << 20;
	return p;
}

static sl_model_config tiny_config(void)
{
	sl_model_config c;
	char path[600];
	snprintf(path, sizeof path, "%s/opt-pre/config.json", fixtures_dir);
	ck_assert_int_eq(sl_model_config_load(path, &c), 0);
	return c;
}

/* A block of B sequences of P-token prompts and G new tokens each. */
static void workload(sl_plan_params *pp, int B, int P, int G)
{
	pp->max_seq = B;
	pp->max_prompt = P;
	pp->max_len = P + G;
	pp->max_rows = B * P;
}

/* The default policy with every weight on the host, overlapped, for that
 * workload. */
static sl_plan_params host_weights(int B, int P, int G)
{
	sl_plan_params pp = sl_plan_defaults();
	pp.w_gpu = 0;
	pp.w_cpu = 100;
	pp.overlap = true;
	workload(&pp, B, P, G);
	return pp;
}

/* The default policy's plan (everything on the device, dense, one
 * micro-batch) of that workload, on the CPU backend. */
static void device_plan(const sl_model_config *c, int B, int P, int G, sl_plan_params *pp, sl_plan *pl)
{
	*pp = sl_plan_defaults();
	workload(pp, B, P, G);
	ck_assert_int_eq(sl_plan_make(c, pp, true, pl), 0);
}

/* Everything on the device, dense, one micro-batch: the FLOPs of each
 * phase and its time from the round rates, worked by hand. */
START_TEST(test_hand_worked)
{
	const sl_model_config c = tiny_config(); /* 2 layers, hidden 64, ffn 256, 4 heads, vocab 512 */
	ck_assert_int_eq(c.n_layer, 2);
	const double h = 64, f = 256, V = 512, L = 2;
	const int B = 4, P = 8, G = 5;
	sl_profile prof = round_profile(true);
	sl_plan_params pp;
	sl_plan pl;
	device_plan(&c, B, P, G, &pp, &pl);
	sl_cost k;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
	/* prefill: six GEMMs of B*P rows per layer, causal attention, the head
	 * over each sequence's last row */
	const double rows = B * P;
	const double pf_gemm = 2 * rows * (4 * h * h + 2 * h * f);
	const double pf_attn = 4.0 * B * h * P * (P + 1) / 2;
	const double head = 2.0 * B * h * V;
	ck_assert_double_eq_tol(k.prefill.work[SL_RES_COMPUTE], L * (pf_gemm + pf_attn) + head, 1e-6);
	/* time: at 1 GFLOP/s per row a GEMM of M rows takes 2 n k / 1e9 s,
	 * whatever M; attention at 8 GFLOP/s; 10 ops per layer (2 norms, 6
	 * GEMMs, 1 attention + 1 for the part), 6 for the head; 1 us each */
	const double g_hh = 2 * h * h / 1e9, g_fh = 2 * f * h / 1e9;
	const double pf_layer = 4 * g_hh + 2 * g_fh + pf_attn / 8e9 + 9e-6;
	const double pf_head = 2 * V * h / 1e9 + 6e-6;
	ck_assert_double_eq_tol(k.prefill.seconds, L * pf_layer + pf_head, 1e-12);
	ck_assert_double_eq_tol(k.prefill.busy[SL_RES_COMPUTE], k.prefill.seconds, 1e-12);
	for (int r = 1; r < SL_NRES; r++)
		ck_assert_double_eq(k.prefill.work[r], 0);
	/* decode: G - 1 steps; step i attends over the P + i - 1 cached tokens
	 * and the new one, reading K and V at 4 GB/s */
	double dc_flop = 0, dc_s = 0;
	for (int i = 1; i < G; i++) {
		const double len = P + i - 1;
		const double gemm = 2.0 * B * (4 * h * h + 2 * h * f);
		const double attn = 4.0 * B * h * (len + 1);
		const double bytes = 2.0 * B * (len + 1) * h * 2;
		dc_flop += L * (gemm + attn) + head;
		dc_s += L * (4 * g_hh + 2 * g_fh + bytes / 4e9 + 9e-6) + pf_head;
	}
	ck_assert_double_eq_tol(k.decode.work[SL_RES_COMPUTE], dc_flop, 1e-6);
	ck_assert_double_eq_tol(k.decode.seconds, dc_s, 1e-12);
	ck_assert_double_eq_tol(k.tok_s, B * G / (k.prefill.seconds + k.decode.seconds), 1e-9);
	ck_assert_int_eq(k.prefill.bottleneck, SL_RES_COMPUTE);
	/* peaks: the plan's */
	ck_assert_uint_eq(k.peak.device, pl.total.device);
	ck_assert_uint_eq(k.peak.host, pl.total.host);
}
END_TEST

/* sluice profile --fit: the profile's fit_prefill and fit_decode scale
 * every phase's compute (the GEMMs, attention, ops, the head) and nothing
 * else: the disk's time of weights on disk stays the rates'. */
START_TEST(test_fit_scales_compute)
{
	const sl_model_config c = tiny_config();
	const int B = 4, P = 8, G = 5;
	sl_profile prof = round_profile(true);
	sl_plan_params pp;
	sl_plan pl;
	device_plan(&c, B, P, G, &pp, &pl);
	sl_cost k0, k1;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k0), 0);
	prof.fit_prefill = 1.5;
	prof.fit_decode = 0.75;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k1), 0);
	ck_assert_double_eq_tol(k1.prefill.seconds, 1.5 * k0.prefill.seconds, 1e-15);
	ck_assert_double_eq_tol(k1.decode.seconds, 0.75 * k0.decode.seconds, 1e-15);
	ck_assert_double_eq_tol(k1.prefill.busy[SL_RES_COMPUTE], 1.5 * k0.prefill.busy[SL_RES_COMPUTE], 1e-15);
	ck_assert_double_eq(k1.prefill.work[SL_RES_COMPUTE], k0.prefill.work[SL_RES_COMPUTE]);
	/* the weights on disk, no overlap: the disk's seconds unchanged, the
	 * compute's scaled */
	pp.w_gpu = pp.w_cpu = 0;
	pp.overlap = false;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
	prof.fit_prefill = prof.fit_decode = 0; /* 0: not fitted, as 1 */
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k0), 0);
	prof.fit_prefill = prof.fit_decode = 2;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k1), 0);
	ck_assert(k0.decode.busy[SL_RES_DISK_READ] > 0);
	ck_assert_double_eq(k1.decode.busy[SL_RES_DISK_READ], k0.decode.busy[SL_RES_DISK_READ]);
	ck_assert_double_eq_tol(k1.decode.busy[SL_RES_COMPUTE], 2 * k0.decode.busy[SL_RES_COMPUTE], 1e-15);
	ck_assert_double_eq_tol(k1.decode.seconds - k0.decode.seconds, k0.decode.busy[SL_RES_COMPUTE], 1e-12);
}
END_TEST

/* Weights on the host, overlapped.  The CPU backend reads them in place:
 * no copy, the time of the weights on the device.  A GPU copies them and
 * the copies hide under the compute.  On the CPU backend copies (here the
 * KV cache's, from the host tier) and compute take turns, less the
 * profile's measured share (copy_overlap) of the shorter. */
START_TEST(test_hand_worked_streamed)
{
	const sl_model_config c = tiny_config();
	const int B = 2, P = 4, G = 2;
	sl_profile prof = round_profile(true);
	sl_plan_params pp = host_weights(B, P, G);
	pp.sep_layer = false;
	sl_plan pl, dev;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
	sl_cost k, kd;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
	pp.w_gpu = 100;
	pp.w_cpu = 0;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &dev), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &dev, &prof, P, G, &kd), 0);
	/* a layer's weights: four h x h and two h x f matrices of halves,
	 * their biases and the two norms', each 64-byte aligned */
	const double h = 64, f = 256;
	const double lw = 2 * (4 * h * h + 2 * h * f) + 2 * (4 * h + f + h) + 4 * 2 * h;
	/* the CPU backend: read in place */
	for (int ph = 0; ph < 2; ph++) {
		const sl_cost_phase *a = ph ? &k.decode : &k.prefill, *b = ph ? &kd.decode : &kd.prefill;
		ck_assert_double_eq_tol(a->work[SL_RES_H2D], 0, 1e-12);
		ck_assert_double_eq_tol(a->seconds, b->seconds, 1e-12);
	}
	ck_assert_uint_lt(pl.total.device, dev.total.device);
	/* a GPU copies a layer at 2 GB/s and 1 us each forward */
	const double cp = lw / 2e9 + 1e-6;
	pp.w_gpu = 0;
	pp.w_cpu = 100;
	sl_profile gpu = round_profile(false);
	gpu.copy_overlap = 1; /* read on the CPU backend only */
	sl_plan pg, pgo;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &pg), 0);
	sl_cost kg0;
	ck_assert_int_eq(sl_cost_eval(&c, &pg, &gpu, P, G, &kg0), 0);
	ck_assert_double_eq_tol(kg0.prefill.work[SL_RES_H2D], 2 * lw, 0.5);
	ck_assert_double_eq_tol(kg0.decode.work[SL_RES_H2D], 2 * lw, 0.5);
	ck_assert_double_eq_tol(kg0.prefill.busy[SL_RES_H2D], 2 * cp, 1e-12);
	/* the CPU backend's copies (the cache's, from the host tier) and
	 * compute in turn: copy_overlap s takes s of the shorter off each
	 * step, linearly, and only when the policy overlaps */
	pp.w_gpu = 100;
	pp.w_cpu = 0;
	pp.cache_gpu = 0;
	pp.cache_cpu = 100;
	sl_plan pc, pco;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pc), 0);
	pp.overlap = false;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pco), 0);
	sl_cost s0, s5, s1, n0, n1;
	ck_assert_int_eq(sl_cost_eval(&c, &pc, &prof, P, G, &s0), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &pco, &prof, P, G, &n0), 0);
	ck_assert_double_gt(s0.decode.work[SL_RES_H2D], 0);
	prof.copy_overlap = 0.5;
	ck_assert_int_eq(sl_cost_eval(&c, &pc, &prof, P, G, &s5), 0);
	prof.copy_overlap = 1;
	ck_assert_int_eq(sl_cost_eval(&c, &pc, &prof, P, G, &s1), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &pco, &prof, P, G, &n1), 0);
	prof.copy_overlap = 0;
	ck_assert_double_gt(s0.seconds - s1.seconds, 1e-9);
	ck_assert_double_eq_tol(s0.seconds - s5.seconds, 0.5 * (s0.seconds - s1.seconds), 1e-12);
	ck_assert_double_eq_tol(n0.seconds, n1.seconds, 1e-12);
	ck_assert_double_eq_tol(s0.seconds, n0.seconds, 1e-12);
	/* a GPU: the copies hide under the compute when overlapped */
	pp.w_gpu = 0;
	pp.w_cpu = 100;
	pp.cache_gpu = 100;
	pp.cache_cpu = 0;
	pp.overlap = true;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &pg), 0);
	pp.overlap = false;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &pgo), 0);
	sl_cost kg, kgo;
	ck_assert_int_eq(sl_cost_eval(&c, &pg, &gpu, P, G, &kg), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &pgo, &gpu, P, G, &kgo), 0);
	ck_assert_double_eq_tol(kgo.prefill.seconds - kg.prefill.seconds, cp, 1e-12);
	ck_assert_uint_eq(kg.peak.device, pg.total.device + (1 << 20));
}
END_TEST

/*
 * sep_layer halves (a slot each for the attention's and the MLP's
 * weights): the MLP's copy hides only under the attention's compute and
 * the next attention's under the MLP's, so a layer takes max(C_A, H_M) +
 * max(C_M, H_A), not max(C, H) as whole layers do.  Where the copies or
 * the compute rule both halves the two agree; between, the halves take
 * longer.  A GPU, weights on the host, overlapped.
 */
START_TEST(test_hand_worked_halves)
{
	const sl_model_config c = tiny_config();
	const int B = 2, P = 4, G = 4;
	sl_profile gpu = round_profile(false);
	sl_plan_params pp = host_weights(B, P, G);
	sl_plan halves, whole;
	pp.sep_layer = true;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &halves), 0);
	pp.sep_layer = false;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &whole), 0);
	double most = 0; /* the largest relative gap */
	for (double gbps = 1e-4; gbps <= 1e4; gbps *= 1.25) {
		gpu.h2d_gbps = gbps;
		sl_cost kh, kw;
		ck_assert_int_eq(sl_cost_eval(&c, &halves, &gpu, P, G, &kh), 0);
		ck_assert_int_eq(sl_cost_eval(&c, &whole, &gpu, P, G, &kw), 0);
		ck_assert_double_eq_tol(kh.decode.work[SL_RES_H2D], kw.decode.work[SL_RES_H2D], 0.5);
		const double gap = (kh.decode.seconds - kw.decode.seconds) / kw.decode.seconds;
		ck_assert_msg(gap > -1e-9, "%g GB/s: halves %g s, whole layers %g s: never faster", gbps,
			      kh.decode.seconds, kw.decode.seconds);
		/* one resource rules: the same, but for a copy's latency (1 us)
		 * more a layer where the copies rule, and a forward where the
		 * compute does (the first layer's load, not overlapped) */
		if (gbps < 2e-4 || gbps > 5e3)
			ck_assert_msg(kh.decode.seconds - kw.decode.seconds < (G - 1) * (c.n_layer + 1) * 1.001e-6, "%g GB/s: halves %g s against %g", gbps, kh.decode.seconds,
				      kw.decode.seconds);
		most = fmax(most, gap);
	}
	ck_assert_msg(most > 0.05, "somewhere between, the halves take longer: at most %.3f%%", 100 * most);
}
END_TEST

/* A zstd store (sluice convert --zstd): the disk reads the frames' pages
 * (the ratio of the layer's bytes), a request per frame of at most 4 MiB,
 * and the host's threads decompress the layer at the profile's zstd_gbps;
 * on the CPU backend that is compute's chain, beside the disk; on a GPU a
 * chain of its own.  A ratio outside (0, 1] is refused. */
START_TEST(test_hand_worked_zstd)
{
	const sl_model_config c = tiny_config();
	const double h = 64, f = 256, L = 2;
	const int B = 2, P = 4, G = 2;
	sl_profile prof = round_profile(true);
	prof.zstd_gbps = 2;
	sl_plan_params pp = sl_plan_defaults();
	pp.w_gpu = pp.w_cpu = 0;
	pp.sep_layer = false;
	pp.overlap = true;
	workload(&pp, B, P, G);
	sl_plan plain, z, dev;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &plain), 0);
	pp.w_zstd = 0.5;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &z), 0);
	pp.w_gpu = 100;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &dev), 0);
	sl_cost kp, kz, kd;
	ck_assert_int_eq(sl_cost_eval(&c, &plain, &prof, P, G, &kp), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &z, &prof, P, G, &kz), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &dev, &prof, P, G, &kd), 0);
	const double lw = kp.prefill.work[SL_RES_DISK_READ] / L;
	ck_assert(lw > 90000 && lw < 110000); /* one frame */
	ck_assert_double_eq_tol(kp.prefill.work[SL_RES_ZSTD], 0, 1e-12);
	ck_assert_double_eq_tol(kz.prefill.work[SL_RES_DISK_READ], L * 0.5 * lw, 1e-6);
	ck_assert_double_eq_tol(kz.decode.work[SL_RES_DISK_READ], (G - 1) * L * 0.5 * lw, 1e-6);
	const double D = 0.5 * lw / 1e9 + 1e-6, Z = lw / 2e9;
	ck_assert_double_eq_tol(kz.prefill.busy[SL_RES_DISK_READ], L * D, 1e-12);
	ck_assert_double_eq_tol(kz.prefill.work[SL_RES_ZSTD], L * lw, 1e-6);
	ck_assert_double_eq_tol(kz.prefill.busy[SL_RES_ZSTD], L * Z, 1e-12);
	/* the CPU backend: a layer's compute and decompression, beside its
	 * read (the disk hidden wholly where not measured), the first
	 * layer's read and decompression waited for */
	const double g_hh = 2 * h * h / 1e9, g_fh = 2 * f * h / 1e9;
	const double C = 4 * g_hh + 2 * g_fh + 4.0 * B * h * P * (P + 1) / 2 / 8e9 + 9e-6;
	ck_assert_double_eq_tol(kz.prefill.seconds, kd.prefill.seconds + L * (fmax(C + Z, D) - C) + D + Z, 1e-12);
	/* where the disk is slow the frames pay: at 0.1 GB/s the plain read
	 * takes longer than half of it and the decompression */
	prof.disk_read_gbps = 0.1;
	ck_assert_int_eq(sl_cost_eval(&c, &plain, &prof, P, G, &kp), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &z, &prof, P, G, &kz), 0);
	ck_assert_double_lt(kz.seconds, kp.seconds);
	/* where it is fast and decompression slow they do not */
	prof.disk_read_gbps = 10;
	prof.zstd_gbps = 0.05;
	ck_assert_int_eq(sl_cost_eval(&c, &plain, &prof, P, G, &kp), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &z, &prof, P, G, &kz), 0);
	ck_assert_double_gt(kz.seconds, kp.seconds);
	/* a GPU: decompression is a chain of its own */
	sl_profile gpu = round_profile(false);
	gpu.zstd_gbps = 0.01;
	pp.w_gpu = 0;
	sl_plan zg;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &zg), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &zg, &gpu, P, G, &kz), 0);
	ck_assert_double_eq_tol(kz.prefill.busy[SL_RES_ZSTD], L * lw / 0.01e9, 1e-12);
	ck_assert_int_eq(kz.prefill.bottleneck, SL_RES_ZSTD);
	ck_assert_double_ge(kz.prefill.seconds, kz.prefill.busy[SL_RES_ZSTD]);
	/* the ratio is a share */
	pp.w_zstd = 1.5;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &zg), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "zstd"), "%s", sl_errmsg());
	pp.w_zstd = -0.5;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &zg), SL_EINVAL);
}
END_TEST

/* The disk as the profile measures it: weights on the disk read at the
 * segment curve's rate at a unit's size, the cache's decode pages written
 * at the page rate, and on the CPU backend the measured share of the disk
 * hidden under compute; a profile without them predicts as before. */
START_TEST(test_hand_worked_disk)
{
	const sl_model_config c = tiny_config();
	const double h = 64, L = 2;
	const int B = 2, P = 4, G = 2;
	sl_profile prof = round_profile(true);
	sl_plan_params pp = sl_plan_defaults();
	pp.w_gpu = pp.w_cpu = 0; /* every weight on the disk */
	pp.sep_layer = false;    /* one unit a layer */
	pp.overlap = true;
	workload(&pp, B, P, G);
	sl_plan pl, dev;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
	pp.w_gpu = 100;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &dev), 0);
	sl_cost kd, k1;
	ck_assert_int_eq(sl_cost_eval(&c, &dev, &prof, P, G, &kd), 0);
	/* no curve: the layer's bytes at disk_read_gbps (1 GB/s) and a 1 us
	 * latency, and the disk hides wholly under the compute or the reverse */
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k1), 0);
	const double lw = k1.prefill.work[SL_RES_DISK_READ] / L; /* test_traffic_counted: the runtime's */
	ck_assert(lw > 90000 && lw < 110000);
	ck_assert_double_eq_tol(k1.prefill.busy[SL_RES_DISK_READ], L * (lw / 1e9 + 1e-6), 1e-12);
	/* a layer's compute in the prefill (test_hand_worked): six GEMMs at 1
	 * GFLOP/s a row, the causal attention at 8 GFLOP/s, 9 ops of 1 us */
	const double f = 256, g_hh = 2 * h * h / 1e9, g_fh = 2 * f * h / 1e9;
	const double C = 4 * g_hh + 2 * g_fh + 4.0 * B * h * P * (P + 1) / 2 / 8e9 + 9e-6;
	const double D1 = lw / 1e9 + 1e-6;
	/* every layer max(C, D), and the first layer's read waited for */
	ck_assert_double_eq_tol(k1.prefill.seconds, kd.prefill.seconds + L * (fmax(C, D1) - C) + D1, 1e-12);

	/* the segment curve: 0.25 GB/s at 16 KiB, 1 GB/s at 256 KiB, log-log
	 * between: a unit of lw bytes reads at 0.25 * 4^(log(lw / 16 KiB) /
	 * log 16), no latency term (the curve's requests had theirs) */
	prof.disk_seg.npoints = 2;
	prof.disk_seg.outstanding = 2;
	prof.disk_seg.bytes[0] = 16384;
	prof.disk_seg.gbps[0] = 0.25;
	prof.disk_seg.bytes[1] = 262144;
	prof.disk_seg.gbps[1] = 1;
	const double g = 0.25 * pow(4, log(lw / 16384) / log(16));
	const double D = lw / (g * 1e9);
	ck_assert(D > C); /* about 160 us against 108 */
	sl_cost k;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
	ck_assert_double_eq_tol(k.prefill.busy[SL_RES_DISK_READ], L * D, 1e-12);
	ck_assert_double_eq_tol(k.decode.busy[SL_RES_DISK_READ], (G - 1) * L * D, 1e-12);
	ck_assert_double_eq_tol(k.prefill.seconds, kd.prefill.seconds + L * (D - C) + D, 1e-12);
	/* beyond the curve's ends: its end points' rates */
	prof.disk_seg.bytes[0] = 1 << 20;
	prof.disk_seg.bytes[1] = 4 << 20;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
	ck_assert_double_eq_tol(k.prefill.busy[SL_RES_DISK_READ], L * lw / 0.25e9, 1e-12);
	prof.disk_seg.bytes[0] = 1024;
	prof.disk_seg.bytes[1] = 4096;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
	ck_assert_double_eq_tol(k.prefill.busy[SL_RES_DISK_READ], L * lw / 1e9, 1e-12);
	prof.disk_seg.bytes[0] = 16384;
	prof.disk_seg.bytes[1] = 262144;

	/* the measured overlap: a layer takes C + D less that share of the
	 * shorter (C here); 0: in turn; 1: max(C, D) as before */
	prof.have_disk_overlap = true;
	const double shares[] = { 0, 0.25, 1 };
	for (size_t i = 0; i < SL_ARRAY_LEN(shares); i++) {
		prof.disk_overlap = shares[i];
		ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, P, G, &k), 0);
		ck_assert_double_eq_tol(k.prefill.seconds, kd.prefill.seconds + L * (D - shares[i] * C) + D, 1e-12);
	}
	/* without overlap the share changes nothing: every resource in turn */
	pp.w_gpu = 0;
	pp.overlap = false;
	sl_plan po;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &po), 0);
	sl_cost ka, kb;
	prof.disk_overlap = 0.5;
	ck_assert_int_eq(sl_cost_eval(&c, &po, &prof, P, G, &ka), 0);
	prof.have_disk_overlap = false;
	ck_assert_int_eq(sl_cost_eval(&c, &po, &prof, P, G, &kb), 0);
	ck_assert_double_eq_tol(ka.prefill.seconds, kb.prefill.seconds, 1e-12);
	ck_assert_double_eq_tol(ka.prefill.seconds, kd.prefill.seconds + L * D, 1e-12);
	/* a GPU does not read it: its disk has its own chain */
	sl_profile gpu = round_profile(false);
	sl_plan pg;
	pp.overlap = true;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &pg), 0);
	sl_cost kg0, kg1;
	ck_assert_int_eq(sl_cost_eval(&c, &pg, &gpu, P, G, &kg0), 0);
	gpu.have_disk_overlap = true;
	gpu.disk_overlap = 0;
	ck_assert_int_eq(sl_cost_eval(&c, &pg, &gpu, P, G, &kg1), 0);
	ck_assert_double_eq_tol(kg0.prefill.seconds, kg1.prefill.seconds, 1e-15);

	/* the cache on the disk: the decode step reads the micro-batch's
	 * segment (one request, the curve at its size) and writes the changed
	 * pages at the page rate; the prefill writes the segment at
	 * disk_write_gbps (0.5 GB/s) and a latency, as before */
	prof = round_profile(true);
	pp = sl_plan_defaults();
	pp.cache_gpu = pp.cache_cpu = 0;
	workload(&pp, B, P, G);
	sl_plan pc;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pc), 0);
	sl_cost c0, c1;
	ck_assert_int_eq(sl_cost_eval(&c, &pc, &prof, P, G, &c0), 0);
	const double seg = c0.decode.work[SL_RES_DISK_READ] / L, wr = c0.decode.work[SL_RES_DISK_WRITE] / L;
	const double pw = c0.prefill.work[SL_RES_DISK_WRITE] / L;
	ck_assert(seg > 0 && wr > 0 && pw > 0 && fmod(wr, 4096) == 0);
	/* as before: 4 page writes a layer (K and V of 2 sequences), 1 us each */
	ck_assert_double_eq_tol(c0.decode.busy[SL_RES_DISK_WRITE], L * (wr / 0.5e9 + 4e-6), 1e-12);
	ck_assert_double_eq_tol(c0.decode.busy[SL_RES_DISK_READ], L * (seg / 1e9 + 1e-6), 1e-12);
	prof.disk_page_write_gbps = 0.125;
	prof.disk_seg.npoints = 2;
	prof.disk_seg.outstanding = 2;
	prof.disk_seg.bytes[0] = 1024;
	prof.disk_seg.gbps[0] = 0.5;
	prof.disk_seg.bytes[1] = 65536;
	prof.disk_seg.gbps[1] = 2;
	ck_assert(seg > 1024 && seg < 65536);
	ck_assert_int_eq(sl_cost_eval(&c, &pc, &prof, P, G, &c1), 0);
	ck_assert_double_eq_tol(c1.decode.busy[SL_RES_DISK_WRITE], L * wr / 0.125e9, 1e-12);
	const double gs = 0.5 * pow(4, log(seg / 1024) / log(64));
	ck_assert_double_eq_tol(c1.decode.busy[SL_RES_DISK_READ], L * seg / (gs * 1e9), 1e-12);
	ck_assert_double_eq_tol(c1.prefill.busy[SL_RES_DISK_WRITE], L * (pw / 0.5e9 + 1e-6), 1e-12);
}
END_TEST

/* ---- the bytes the runtime counts ------------------------------------- */

typedef struct tpol {
	double wg, wc, cg, cc;
	int micro;
	bool sep, act, h2o, ccc;
	bool q4; /* a 4-bit compressed cache */
	bool wq4; /* 4-bit weights (compress_weight) */
} tpol;

static const tpol traffic_grid[] = {
	{ 100, 0, 100, 0, 0, true, false, false, false, false, false },  { 0, 100, 100, 0, 0, true, false, false, false, false, false },
	{ 0, 100, 100, 0, 0, false, false, false, false, false, false }, { 0, 0, 100, 0, 0, true, false, false, false, false, false },
	{ 30, 30, 100, 0, 0, true, false, false, false, false, false },  { 100, 0, 0, 100, 0, true, false, false, false, false, false },
	{ 100, 0, 0, 0, 0, true, false, false, false, false, false },    { 100, 0, 34, 33, 3, true, false, false, false, false, false },
	{ 100, 0, 0, 100, 0, true, false, true, false, false, false },   { 100, 0, 0, 0, 0, true, false, true, false, false, false },
	{ 0, 50, 0, 50, 2, false, true, true, false, false, false },     { 100, 0, 100, 0, 2, true, true, false, false, false, false },
	{ 0, 100, 0, 100, 2, true, true, false, false, false, false },   { 100, 0, 100, 0, 0, true, true, false, false, false, false },
	{ 0, 0, 0, 0, 0, false, true, false, false, false, false },      { 100, 0, 0, 100, 0, true, false, false, true, false, false },
	{ 0, 100, 0, 100, 3, false, false, true, true, false, false }, { 100, 0, 34, 33, 2, true, true, true, true, false, false },
	/* the compressed cache in every tier, with H2O and cpu_cache_compute */
	{ 100, 0, 100, 0, 0, true, false, false, false, true, false },
	{ 100, 0, 0, 100, 0, true, false, false, false, true, false },
	{ 100, 0, 0, 0, 0, true, false, false, false, true, false },
	{ 0, 100, 34, 33, 3, true, true, false, false, true, false },
	{ 100, 0, 0, 100, 0, true, false, true, false, true, false },
	{ 100, 0, 0, 0, 0, true, false, true, false, true, false },
	{ 100, 0, 0, 100, 0, true, false, false, true, true, false },
	{ 100, 0, 34, 33, 2, true, true, true, true, true, false },
	/* 4-bit weights in every tier, whole and by halves, with the 4-bit
	 * cache, H2O and cpu_cache_compute */
	{ 100, 0, 100, 0, 0, true, false, false, false, false, true },
	{ 0, 100, 100, 0, 0, true, false, false, false, false, true },
	{ 0, 100, 100, 0, 0, false, false, false, false, false, true },
	{ 0, 0, 100, 0, 0, true, false, false, false, false, true },
	{ 0, 0, 0, 0, 0, false, true, false, false, false, true },
	{ 30, 30, 34, 33, 3, true, true, false, false, true, true },
	{ 0, 50, 0, 50, 2, false, true, true, true, true, true },
};

/* The backend the counted runs use: the CPU backend, or (test_cost_emu)
 * the CUDA backend on its emulation, whose device memory is not host
 * memory: the disk's bytes cross h2d, cpu_cache_compute runs. */
#ifdef SL_COST_EMU
#define COUNTED_BACKEND "cuda"
#else
#define COUNTED_BACKEND "cpu"
#endif

/* Run the block like `sluice bench`: B equal prompts of P tokens, a
 * prefill, G - 1 decode steps; the counted bytes of each phase. */
static void run_counted(const tpol *t, int B, int P, int G, sl_offload_stats *pf,
			sl_offload_stats *dc, sl_cost *pred)
{
	char dir[600], store[400];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	snprintf(store, sizeof store, "%s/w%g-%g", offdir, t->wg, t->wc);
	mkdir(store, 0755);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create(COUNTED_BACKEND, 1, &be), 0);
	const bool host = be->ops->dev_is_host;
	sl_plan_params pp = sl_plan_defaults();
	pp.cpu_cache_compute = t->ccc;
	pp.w_gpu = t->wg;
	pp.w_cpu = t->wc;
	pp.cache_gpu = t->cg;
	pp.cache_cpu = t->cc;
	pp.micro = t->micro;
	pp.sep_layer = t->sep;
	pp.act_host = t->act;
	pp.kv_q4 = t->q4;
	pp.w_q4 = t->wq4;
	if (t->h2o)
		pp.hh = pp.rr = 0.25;
	workload(&pp, B, P, G);
	const sl_model_params mp = { .dir = dir, .offload_dir = store, .plan = &pp };
	sl_model *m = NULL;
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	sl_profile prof = round_profile(host);
	ck_assert_int_eq(sl_cost_eval(&m->cfg, &m->plan, &prof, P, G, pred), 0);
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_make(&m->kv_env, B, P, P + G, &kv), 0);
	int32_t *ids = calloc((size_t)B * P, sizeof *ids), next[64];
	int npad[64] = { 0 };
	for (int i = 0; i < B * P; i++)
		ids[i] = 3 + (i * 37) % 500;
	sl_model_stats_reset(m);
	ck_assert_int_eq(sl_model_prefill(m, kv, ids, npad, P, NULL), 0);
	ck_assert_int_eq(sl_model_argmax(m, B, next), 0);
	sl_model_stats(m, 1, pf);
	sl_model_stats_reset(m);
	for (int s = 1; s < G; s++) {
		ck_assert_int_eq(sl_model_decode(m, kv, next), 0);
		ck_assert_int_eq(sl_model_argmax(m, B, next), 0);
	}
	sl_model_stats(m, 1, dc);
	free(ids);
	sl_kv_free(kv);
	sl_model_free(m);
	sl_backend_free(be);
}

static void check_phase(const char *what, const char *phase, const sl_cost_phase *p,
			const sl_offload_stats *s)
{
	ck_assert_msg(p->work[SL_RES_H2D] == (double)s->h2d_bytes,
		      "%s %s: h2d predicted %.0f, counted %llu", what, phase, p->work[SL_RES_H2D],
		      (unsigned long long)s->h2d_bytes);
	ck_assert_msg(p->work[SL_RES_D2H] == (double)s->d2h_bytes,
		      "%s %s: d2h predicted %.0f, counted %llu", what, phase, p->work[SL_RES_D2H],
		      (unsigned long long)s->d2h_bytes);
	ck_assert_msg(p->work[SL_RES_DISK_READ] == (double)s->disk_read_bytes,
		      "%s %s: disk reads predicted %.0f, counted %llu", what, phase,
		      p->work[SL_RES_DISK_READ], (unsigned long long)s->disk_read_bytes);
	ck_assert_msg(p->work[SL_RES_DISK_WRITE] == (double)s->disk_write_bytes,
		      "%s %s: disk writes predicted %.0f, counted %llu", what, phase,
		      p->work[SL_RES_DISK_WRITE], (unsigned long long)s->disk_write_bytes);
}

START_TEST(test_traffic_counted)
{
	const tpol *t = &traffic_grid[_i];
	char what[200];
	snprintf(what, sizeof what, "%s: w %g/%g cache %g/%g micro %d%s%s%s%s%s%s", COUNTED_BACKEND, t->wg,
		 t->wc, t->cg, t->cc, t->micro, t->sep ? " sep" : "", t->act ? " act_host" : "",
		 t->h2o ? " h2o" : "", t->ccc ? " cpu_cache_compute" : "", t->q4 ? " 4-bit cache" : "",
		 t->wq4 ? " 4-bit weights" : "");
	sl_offload_stats pf, dc;
	sl_cost k;
	run_counted(t, 6, 16, 9, &pf, &dc, &k);
	check_phase(what, "prefill", &k.prefill, &pf);
	check_phase(what, "decode", &k.decode, &dc);
}
END_TEST

/*
 * A decode step reads of the cache's disk part only the pages holding rows
 * in use (as FlexGen reads its cache up to the tokens so far): over a long
 * generation (blocks of 56 slots of 128 bytes, pages that hold none in the
 * early steps) the counted reads match the prediction and fall below
 * every step reading its segments whole.  Dense and 4-bit, in one, two and
 * three micro-batches, the cache wholly or partly on disk.
 */
START_TEST(test_traffic_counted_rows_in_use)
{
	static const tpol grid[] = {
		{ 100, 0, 0, 0, 0, true, false, false, false, false, false },
		{ 100, 0, 0, 0, 3, true, false, false, false, false, false },
		{ 100, 0, 34, 33, 2, true, false, false, false, false, false },
		{ 100, 0, 0, 0, 0, true, false, false, false, true, false },
	};
	const tpol *t = &grid[_i];
	const int B = 6, P = 8, G = 48, L = 2;
	sl_offload_stats pf, dc;
	sl_cost k;
	run_counted(t, B, P, G, &pf, &dc, &k);
	char what[120];
	snprintf(what, sizeof what, "rows in use: cache %g/%g micro %d%s", t->cg, t->cc, t->micro,
		 t->q4 ? " 4-bit cache" : "");
	check_phase(what, "prefill", &k.prefill, &pf);
	check_phase(what, "decode", &k.decode, &dc);
	/* the segments whole: each micro-batch's disk sequences' K and V blocks */
	const int gs = t->micro ? t->micro : B; /* sequences a micro-batch */
	const size_t slot = sl_kv_slot_bytes(4, 16, false, t->q4);
	size_t whole = 0;
	for (int s0 = 0; s0 < B; s0 += gs) {
		const sl_kvt_split sp = sl_kvt_split_of(gs, t->cg, t->cc);
		const size_t seg = ((size_t)sp.disk * 2 * (P + G) * slot + 4095) / 4096 * 4096;
		whole += (size_t)(G - 1) * L * seg;
	}
	ck_assert_msg(dc.disk_read_bytes > 0 && dc.disk_read_bytes < whole,
		      "%s: read %llu bytes in the decode, the segments whole %zu", what,
		      (unsigned long long)dc.disk_read_bytes, whole);
}
END_TEST

/* ---- the search ------------------------------------------------------- */

START_TEST(test_search_fits_and_ranks)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-1.3b", &c), 0);
	sl_profile prof = round_profile(true);
	sl_search_params sp = { .prompt_len = 128, .gen_len = 32, .disk = true };
	sp.budget.device = (size_t)1 << 30;
	sp.budget.host = (size_t)2 << 30;
	sl_choice best[8];
	int n = 0;
	sl_search_stats ev;
	ck_assert_msg(sl_search(&c, &prof, &sp, best, 8, &n, &ev) == 0, "%s", sl_errmsg());
	ck_assert_int_gt(n, 1);
	ck_assert_int_gt(ev.evaluated, n);
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(sl_cost_fits(&best[i].cost.peak, &sp.budget, NULL), 0);
		if (i)
			ck_assert(best[i - 1].cost.tok_s >= best[i].cost.tok_s);
		/* its evaluation agrees with the search's */
		sl_choice e;
		int fit = -1;
		ck_assert_int_eq(sl_search_evaluate(&c, &prof, &sp, &best[i].pol, &e, &fit), 0);
		ck_assert_int_eq(fit, 0);
		ck_assert_double_eq(e.cost.tok_s, best[i].cost.tok_s);
	}
	/* the weights (2.6 GB) cannot all sit in 1G of device and 2G of host */
	ck_assert(best[0].pol.w_gpu_percent + best[0].pol.w_cpu_percent < 100);
	/* and the host holds its most, to the percent (not the grid's 10):
	 * one percent more is over the host budget */
	for (int i = 0; i < n; i++) {
		sl_policy more = best[i].pol;
		more.w_cpu_percent += 1;
		sl_choice e;
		int fit = 0;
		ck_assert_int_eq(sl_search_evaluate(&c, &prof, &sp, &more, &e, &fit), 0);
		ck_assert_msg(fit == SL_EBUDGET && strstr(sl_errmsg(), "host: needs"),
			      "candidate %d (w %g/%g): one percent more on the host: %d %s", i,
			      best[i].pol.w_gpu_percent, best[i].pol.w_cpu_percent, fit, sl_errmsg());
	}
	/* the default policy (all on the device) does not fit */
	sl_policy d;
	sl_policy_default(&d);
	sl_choice e;
	int fit = 0;
	ck_assert_int_eq(sl_search_evaluate(&c, &prof, &sp, &d, &e, &fit), 0);
	ck_assert_int_eq(fit, SL_EBUDGET);
	ck_assert_ptr_nonnull(strstr(sl_errmsg(), "device: needs"));
	/* --fix pins a field */
	sp.nfix = 2;
	sp.fix[0] = "gpu_batch_size=3";
	sp.fix[1] = "sep_layer=false";
	ck_assert_msg(sl_search(&c, &prof, &sp, best, 8, &n, &ev) == 0, "%s", sl_errmsg());
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(best[i].pol.gpu_batch_size, 3);
		ck_assert(!best[i].pol.sep_layer);
	}
	sp.nfix = 1;
	sp.fix[0] = "gpu_batch_sise=3";
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), SL_EINVAL);
	ck_assert_ptr_nonnull(strstr(sl_errmsg(), "did you mean 'gpu_batch_size'"));
	sp.fix[0] = "gpu_batch_size=0";
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), SL_ERANGE);
	sp.fix[0] = "gpu_batch_size";
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), SL_EINVAL);
}
END_TEST

/* A policy's parts, as docs/cost-model.md counts them: the tiers of the
 * weights and of the cache, activations off the device, each switch off
 * its default. */
static int policy_parts(const sl_policy *p)
{
	const double s[2][2] = { { p->w_gpu_percent, p->w_cpu_percent },
				 { p->cache_gpu_percent, p->cache_cpu_percent } };
	int n = 0;
	for (int i = 0; i < 2; i++)
		n += (s[i][0] > 0) + (s[i][1] > 0) + (100 - s[i][0] - s[i][1] > 0);
	return n + (p->act_cpu_percent > 0) + !p->sep_layer + !p->overlap + p->cpu_cache_compute +
	       p->compress_cache + p->compress_weight;
}

/* Whether a is simpler than b: fewer bytes on the disk (1), then fewer
 * micro-batches (2), then fewer parts (3); the key that decides, negative
 * where b is simpler, 0 where they are as simple. */
static int simpler(const sl_choice *a, const sl_choice *b)
{
	if (a->cost.peak.disk != b->cost.peak.disk)
		return a->cost.peak.disk < b->cost.peak.disk ? 1 : -1;
	if (a->pol.num_gpu_batches != b->pol.num_gpu_batches)
		return a->pol.num_gpu_batches < b->pol.num_gpu_batches ? 2 : -2;
	if (policy_parts(&a->pol) != policy_parts(&b->pol))
		return policy_parts(&a->pol) < policy_parts(&b->pol) ? 3 : -3;
	return 0;
}

/* The margin's checks for one model and budget (MiB); returns the key
 * that set the choice apart from the fastest prediction (0: the same). */
static int check_margin(const char *model, bool cpu, size_t dev_mib, size_t host_mib)
{
	enum { CAP = 400 };
	static sl_choice exact[CAP], ranked[CAP];
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named(model, &c), 0);
	sl_profile prof = round_profile(cpu);
	sl_search_params sp = { .prompt_len = 128, .gen_len = 32, .disk = true };
	sp.budget.device = dev_mib << 20;
	sp.budget.host = host_mib << 20;
	int ne = 0, nr = 0;
	sl_search_stats se, sr;
	ck_assert_msg(sl_search(&c, &prof, &sp, exact, CAP, &ne, &se) == 0, "%s", sl_errmsg());
	ck_assert(sl_policy_equal(&se.fastest.pol, &exact[0].pol));
	for (int i = 1; i < ne; i++)
		ck_assert(exact[i - 1].cost.tok_s >= exact[i].cost.tok_s);
	sp.margin = 0.01;
	ck_assert_msg(sl_search(&c, &prof, &sp, ranked, CAP, &nr, &sr) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sr.evaluated, se.evaluated);
	ck_assert(sl_policy_equal(&sr.fastest.pol, &exact[0].pol));
	ck_assert_double_eq(sr.fastest.cost.tok_s, exact[0].cost.tok_s);
	const double floor = exact[0].cost.tok_s / 1.01;
	const sl_choice *ch = &ranked[0];
	ck_assert(ch->cost.tok_s >= floor);
	int within = 0;
	for (int i = 0; i < ne && exact[i].cost.tok_s >= floor; i++) {
		within++;
		ck_assert_msg(simpler(&exact[i], ch) <= 0,
			      "%s %zuM/%zuM: candidate %d (%d x %d, disk %zu, %d parts, %.4f tok/s) is within the margin and simpler than the choice (%d x %d, disk %zu, %d parts)",
			      model, dev_mib, host_mib, i, exact[i].pol.gpu_batch_size,
			      exact[i].pol.num_gpu_batches, exact[i].cost.peak.disk,
			      policy_parts(&exact[i].pol), exact[i].cost.tok_s, ch->pol.gpu_batch_size,
			      ch->pol.num_gpu_batches, ch->cost.peak.disk, policy_parts(&ch->pol));
	}
	ck_assert_msg(within < CAP, "the exact list holds only the first %d", CAP);
	/* the ranked list: those within the margin first, simplest first,
	 * then the rest by tok/s */
	for (int i = 1; i < nr; i++) {
		const sl_choice *a = &ranked[i - 1], *b = &ranked[i];
		const bool in_a = a->cost.tok_s >= floor, in_b = b->cost.tok_s >= floor;
		ck_assert(in_a || !in_b);
		if (in_a && in_b)
			ck_assert(simpler(a, b) > 0 || (simpler(a, b) == 0 && a->cost.tok_s >= b->cost.tok_s));
		else if (!in_a)
			ck_assert(a->cost.tok_s >= b->cost.tok_s);
	}
	sp.margin = 0.6;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, ranked, CAP, &nr, &sr), SL_ERANGE);
	return sl_policy_equal(&ch->pol, &exact[0].pol) ? 0 : simpler(ch, &exact[0]);
}

/*
 * The margin: among the candidates the fastest prediction leads by at
 * most 1%, the search takes the simplest (a lead that small is well inside
 * the model's error).  Checked against the exact ranking of the same
 * candidates: the fastest is the exact ranking's first; the choice is
 * within the margin of it, and no candidate within the margin is simpler.
 * Under these budgets each key sets the choice apart from the fastest in
 * one at least, so the test sees every key at work.
 */
START_TEST(test_search_margin)
{
	static const struct {
		const char *model;
		bool cpu;
		size_t dev, host;
	} cases[] = {
		{ "opt-125m", true, 256, 1024 },   /* the disk's bytes decide */
		{ "opt-125m", false, 1024, 8192 }, /* the micro-batches */
		{ "opt-125m", false, 1024, 1536 }, /* the parts */
	};
	bool seen[4] = { false };
	for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
		const int k = check_margin(cases[i].model, cases[i].cpu, cases[i].dev, cases[i].host);
		ck_assert_int_ge(k, 0);
		seen[k] = true;
	}
	ck_assert_msg(seen[1] && seen[2] && seen[3], "keys seen: disk %d, micro-batches %d, parts %d",
		      seen[1], seen[2], seen[3]);
}
END_TEST

START_TEST(test_search_nothing_fits)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-1.3b", &c), 0);
	sl_profile prof = round_profile(true);
	sl_search_params sp = { .prompt_len = 128, .gen_len = 32, .disk = true };
	sp.budget.device = (size_t)1 << 20;
	sl_choice best[4];
	int n = 0;
	sl_search_stats ev;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 4, &n, &ev), SL_EBUDGET);
	const char *msg = sl_errmsg();
	const char *at = strstr(msg, "--gpu-mem ");
	ck_assert_msg(at != NULL, "%s", msg);
	/* the named budget fits */
	double v = atof(at + 10);
	const char unit = at[10 + strspn(at + 10, "0123456789.")];
	sp.budget.device = (size_t)ceil(v * (unit == 'G' ? 1073741824.0 : 1048576.0));
	ck_assert_msg(sl_search(&c, &prof, &sp, best, 4, &n, &ev) == 0, "%s", sl_errmsg());
	/* positions */
	sp.prompt_len = 2040;
	sp.gen_len = 32;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 4, &n, &ev), SL_ERANGE);
}
END_TEST

START_TEST(test_search_h2o)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-1.3b", &c), 0);
	sl_profile prof = round_profile(true);
	sl_search_params sp = { .prompt_len = 512, .gen_len = 64, .disk = false };
	sp.budget.device = (size_t)4 << 30;
	sl_choice dense[1], h2o[1];
	int n = 0;
	sl_search_stats ev;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, dense, 1, &n, &ev), 0);
	ck_assert_double_eq(dense[0].pol.hh_ratio, 0);
	sp.h2o = SL_H2O_MIN;
	sp.h2o_ratio = 0.2;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, h2o, 1, &n, &ev), 0);
	ck_assert_double_eq_tol(h2o[0].pol.hh_ratio, 0.1, 1e-12);
	ck_assert_double_eq_tol(h2o[0].pol.recent_ratio, 0.1, 1e-12);
	/* a smaller cache: a larger batch fits, more tokens a second */
	ck_assert(h2o[0].cost.tok_s > dense[0].cost.tok_s);
}
END_TEST

/* compress_cache only where allowed: never without --allow-compress; with
 * it, under a device budget that a long context's cache overflows, the
 * smaller cache wins (a larger block, less traffic). */
START_TEST(test_search_compress)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-1.3b", &c), 0);
	sl_profile prof = round_profile(false);
	sl_search_params sp = { .prompt_len = 512, .gen_len = 64, .disk = false };
	sp.budget.device = (size_t)4 << 30;
	sp.budget.host = (size_t)64 << 30;
	sl_choice best[8];
	int n = 0;
	sl_search_stats ev;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	for (int i = 0; i < n; i++)
		ck_assert(!best[i].pol.compress_cache);
	const double plain = best[0].cost.tok_s;
	sp.allow_compress = true;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	ck_assert_msg(best[0].pol.compress_cache, "the search did not choose the compressed cache");
	ck_assert(best[0].cost.tok_s > plain);
	sp.kv_f32 = true; /* an fp32 cache is never compressed */
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	for (int i = 0; i < n; i++)
		ck_assert(!best[i].pol.compress_cache);
}
END_TEST

/* compress_weight likewise: never without --allow-compress; with it, when
 * the fp16 weights do not fit on the device (opt-1.3b's 2.5 GiB of layers
 * under a 2 GiB device budget, no disk) and the 4-bit ones would, the
 * search chooses them (it may spend the device memory they save on a
 * larger block rather than on the weights); --fix compress_weight=true
 * pins them without it. */
START_TEST(test_search_compress_weight)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-1.3b", &c), 0);
	sl_profile prof = round_profile(false);
	sl_search_params sp = { .prompt_len = 64, .gen_len = 16, .disk = false };
	sp.budget.device = (size_t)2 << 30;
	sp.budget.host = (size_t)64 << 30;
	sl_choice best[8];
	int n = 0;
	sl_search_stats ev;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	ck_assert(n > 0);
	for (int i = 0; i < n; i++)
		ck_assert(!best[i].pol.compress_weight);
	ck_assert(best[0].pol.w_gpu_percent < 100);
	const double plain = best[0].cost.tok_s;
	sp.allow_compress = true;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	ck_assert_msg(best[0].pol.compress_weight, "the search did not choose the 4-bit weights");
	ck_assert(best[0].cost.tok_s > plain);
	sp.allow_compress = false;
	sp.fix[0] = "compress_weight=true";
	sp.nfix = 1;
	ck_assert_int_eq(sl_search(&c, &prof, &sp, best, 8, &n, &ev), 0);
	ck_assert(n > 0);
	for (int i = 0; i < n; i++)
		ck_assert(best[i].pol.compress_weight);
}
END_TEST

/* The 4-bit GEMM's rate: the profile's gemm_q4 curve where measured (at
 * half the fp16 rate, the layers' GEMMs take twice as long); where not,
 * the fp16 curve (the dequantisation taken as free), so everything on the
 * device predicts the same time as fp16 weights. */
START_TEST(test_gemm_q4_rate)
{
	const sl_model_config c = tiny_config();
	sl_profile prof = round_profile(true);
	sl_plan_params pp = sl_plan_defaults();
	pp.max_seq = 4;
	pp.max_prompt = 16;
	pp.max_len = 24;
	sl_plan f16, q4;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &f16), 0);
	pp.w_q4 = true;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &q4), 0);
	ck_assert_uint_lt(q4.weights.device, f16.weights.device);
	sl_cost a, b, d;
	ck_assert_int_eq(sl_cost_eval(&c, &f16, &prof, 16, 8, &a), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &q4, &prof, 16, 8, &b), 0);
	ck_assert_double_eq_tol(a.prefill.seconds, b.prefill.seconds, 1e-15);
	ck_assert_double_eq_tol(a.decode.seconds, b.decode.seconds, 1e-15);
	prof.gemm_q4 = prof.gemm;
	for (int i = 0; i < prof.gemm_q4.npoints; i++)
		prof.gemm_q4.gflops[i] /= 2;
	ck_assert_int_eq(sl_cost_eval(&c, &q4, &prof, 16, 8, &d), 0);
	/* the layers' GEMMs: 2 * rows * (4 h h + 2 h f) FLOPs at the curve's
	 * 1 GFLOP/s per row, so their time at half that rate adds as much again */
	const double h = c.hidden, f = c.ffn, layers = c.n_layer;
	const double gemm_s = layers * 2 * (4 * h * h + 2 * h * f) / 1e9;
	ck_assert_double_eq_tol(d.prefill.seconds - b.prefill.seconds, gemm_s, 1e-12);
	ck_assert_double_eq_tol(d.decode.seconds - b.decode.seconds, 7 * gemm_s, 1e-12);
}
END_TEST

/* A curve at one of the model's own GEMM shapes (gemm_shapes): the GEMMs
 * of that shape run at the gemm curve's rate times the shape's ratio to it
 * (here half, at both its points: fc1 takes twice as long); a shape the
 * model has not, or an empty list, changes nothing; and the shapes a
 * model lists are its decoder's and its head's, each once. */
START_TEST(test_gemm_shape_rate)
{
	const sl_model_config c = tiny_config();
	sl_profile prof = round_profile(true);
	sl_plan_params pp = sl_plan_defaults();
	workload(&pp, 4, 16, 8);
	sl_plan pl;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
	sl_cost a, b, d;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &a), 0);
	const double h = c.hidden, f = c.ffn, layers = c.n_layer;
	sl_profile_curve *s = &prof.gemm_shapes[0];
	*s = (sl_profile_curve){ .npoints = 2, .n = (int)h + 1, .k = (int)h, .m = { 8, 64 },
				 .gflops = { 4, 32 } };
	prof.n_gemm_shapes = 1;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &b), 0);
	ck_assert_double_eq_tol(a.seconds, b.seconds, 1e-15);
	s->n = (int)f; /* fc1: f x h */
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &d), 0);
	const double fc1_s = layers * 2 * f * h / 1e9;
	ck_assert_double_eq_tol(d.prefill.seconds - a.prefill.seconds, fc1_s, 1e-12);
	ck_assert_double_eq_tol(d.decode.seconds - a.decode.seconds, 7 * fc1_s, 1e-12);
	/* each phase at its own point: the prefill's 64 rows at the second
	 * (now a quarter: four times as long), the decode's 4 rows below the
	 * first (still half) */
	s->gflops[1] = 16;
	sl_cost e;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &e), 0);
	ck_assert_double_eq_tol(e.prefill.seconds - a.prefill.seconds, 3 * fc1_s, 1e-12);
	ck_assert_double_eq_tol(e.decode.seconds - a.decode.seconds, 7 * fc1_s, 1e-12);
	/* between the points, the ratio interpolated in log m: 1/2 at 8 and
	 * 1/4 at 64 give 1/2^(1 + 1/3) at 16 rows (blocks of 16 sequences) */
	sl_plan_params p16 = pp;
	workload(&p16, 16, 16, 8);
	sl_plan pl16;
	ck_assert_int_eq(sl_plan_make(&c, &p16, true, &pl16), 0);
	sl_cost g0, g1;
	prof.n_gemm_shapes = 0;
	ck_assert_int_eq(sl_cost_eval(&c, &pl16, &prof, 16, 8, &g0), 0);
	prof.n_gemm_shapes = 1;
	ck_assert_int_eq(sl_cost_eval(&c, &pl16, &prof, 16, 8, &g1), 0);
	ck_assert_double_eq_tol(g1.decode.seconds - g0.decode.seconds, 7 * fc1_s * (pow(2, 4.0 / 3) - 1), 1e-12);
	int sh[8][2];
	ck_assert_int_eq(sl_cost_gemm_shapes(&c, sh, 8), c.embed_dim != c.hidden ? 5 : 4);
	ck_assert_int_eq(sh[0][0], c.hidden);
	ck_assert_int_eq(sh[0][1], c.hidden);
	ck_assert_int_eq(sh[1][0], c.ffn);
	ck_assert_int_eq(sh[2][1], c.ffn);
	ck_assert_int_eq(sh[3][0], c.vocab);
	ck_assert_int_eq(sh[3][1], c.embed_dim);
	sl_model_config l;
	ck_assert_int_eq(sl_model_config_named("llama-3-8b", &l), 0);
	ck_assert_int_eq(sl_cost_gemm_shapes(&l, sh, 8), 5); /* q and out, kv, gate/up, down, head */
	ck_assert_int_eq(sh[1][0], 1024);                   /* 8 KV heads of 128 */
	ck_assert_int_eq(sl_cost_gemm_shapes(&l, sh, 2), 2);
}
END_TEST

/* The cache (gemm_hot, llc_bytes; CPU backend): a layer's micro-batches
 * after its first read its weights at the hot curve's rate (times a
 * shape's ratio to the curve, as cold; reaching the share of its gain
 * --fit found, fit_hot) where the layer's weights fit the cache; not where
 * they do not, not with one micro-batch, never slower than the cold rate,
 * and not on a GPU. */
START_TEST(test_gemm_hot_micro_batches)
{
	const sl_model_config c = tiny_config();
	sl_profile prof = round_profile(true);
	sl_plan_params pp = sl_plan_defaults();
	workload(&pp, 8, 16, 8);
	pp.micro = 2; /* 4 micro-batches of 2 */
	sl_plan pl;
	ck_assert_int_eq(sl_plan_make(&c, &pp, true, &pl), 0);
	sl_cost a, b;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &a), 0);
	prof.gemm_hot = prof.gemm;
	for (int i = 0; i < prof.gemm_hot.npoints; i++)
		prof.gemm_hot.gflops[i] *= 2;
	prof.llc_bytes = 1ull << 40;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &b), 0);
	/* the layers' GEMMs of 3 of the 4 micro-batches take half as long:
	 * 2 rows x (4 h h + 2 h f) x 2 FLOPs at 1 GFLOP/s a row */
	const double h = c.hidden, f = c.ffn, layers = c.n_layer;
	const double mb_s = layers * 2 * (4 * h * h + 2 * h * f) / 1e9; /* a micro-batch, cold */
	ck_assert_double_eq_tol(a.decode.seconds - b.decode.seconds, 7 * 3 * mb_s / 2, 1e-12);
	ck_assert_double_eq_tol(a.prefill.seconds - b.prefill.seconds, 3 * mb_s / 2, 1e-12);
	/* a shape slower than the curve (fc1 at half its rate, gemm_shapes)
	 * is as much slower hot: the hot curve by the same ratio, so the
	 * cache still halves every GEMM's time, fc1's included */
	sl_profile shaped = prof;
	shaped.gemm_shapes[0] = (sl_profile_curve){ .npoints = 2, .n = (int)f, .k = (int)h, .m = { 8, 64 },
						    .gflops = { 4, 32 } };
	shaped.n_gemm_shapes = 1;
	sl_profile shaped_cold = shaped;
	shaped_cold.llc_bytes = 1000;
	sl_cost sc, sh;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &shaped_cold, 16, 8, &sc), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &shaped, 16, 8, &sh), 0);
	const double shaped_s = mb_s + layers * 2 * f * h / 1e9; /* fc1 twice as long */
	ck_assert_double_eq_tol(sc.decode.seconds - sh.decode.seconds, 7 * 3 * shaped_s / 2, 1e-12);
	ck_assert_double_eq_tol(sc.prefill.seconds - sh.prefill.seconds, 3 * shaped_s / 2, 1e-12);
	/* --fit's shares (fit_hot): of the hot rate's gain, a half at 1 row,
	 * none at 4; the decode's 2 rows, between in log m, take a quarter of
	 * it (1.25x the cold rate: 0.8 of its time), the prefill's 32 rows,
	 * beyond the last point, none */
	sl_profile part = prof;
	part.fit_hot_n = 2;
	part.fit_hot_m[0] = 1;
	part.fit_hot_m[1] = 4;
	part.fit_hot_share[0] = 0.5;
	part.fit_hot_share[1] = 0;
	sl_cost pc;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &part, 16, 8, &pc), 0);
	ck_assert_double_eq_tol(a.decode.seconds - pc.decode.seconds, 7 * 3 * mb_s * 0.2, 1e-12);
	ck_assert_double_eq_tol(a.prefill.seconds, pc.prefill.seconds, 1e-15);
	/* a layer larger than the cache, one micro-batch, a slower hot
	 * curve, a GPU: as without it */
	sl_cost d;
	prof.llc_bytes = 1000;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &d), 0);
	ck_assert_double_eq_tol(d.seconds, a.seconds, 1e-15);
	/* the set the cache was measured to keep (llc_hot_bytes) decides, not
	 * hwloc's size: the layers read cold under 1 TiB of cache that keeps
	 * 1000 bytes, and hot where hwloc reports none */
	prof.llc_bytes = 1ull << 40;
	prof.llc_hot_bytes = 1000;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &d), 0);
	ck_assert_double_eq_tol(d.seconds, a.seconds, 1e-15);
	prof.llc_bytes = 0;
	prof.llc_hot_bytes = 1ull << 40;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &d), 0);
	ck_assert_double_eq_tol(d.seconds, b.seconds, 1e-15);
	prof.llc_hot_bytes = 0;
	prof.llc_bytes = 1ull << 40;
	for (int i = 0; i < prof.gemm_hot.npoints; i++)
		prof.gemm_hot.gflops[i] /= 4;
	ck_assert_int_eq(sl_cost_eval(&c, &pl, &prof, 16, 8, &d), 0);
	ck_assert_double_eq_tol(d.seconds, a.seconds, 1e-15);
	sl_plan_params p1 = pp;
	p1.micro = 0;
	sl_plan pl1;
	ck_assert_int_eq(sl_plan_make(&c, &p1, true, &pl1), 0);
	sl_cost e0, e1;
	sl_profile cold = round_profile(true);
	ck_assert_int_eq(sl_cost_eval(&c, &pl1, &cold, 16, 8, &e0), 0);
	for (int i = 0; i < prof.gemm_hot.npoints; i++)
		prof.gemm_hot.gflops[i] *= 8;
	ck_assert_int_eq(sl_cost_eval(&c, &pl1, &prof, 16, 8, &e1), 0);
	ck_assert_double_eq_tol(e0.seconds, e1.seconds, 1e-15);
	sl_profile gpu = round_profile(false), gpu_hot = gpu;
	gpu_hot.gemm_hot = prof.gemm_hot;
	gpu_hot.llc_bytes = 1ull << 40;
	sl_plan plg;
	ck_assert_int_eq(sl_plan_make(&c, &pp, false, &plg), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &plg, &gpu, 16, 8, &e0), 0);
	ck_assert_int_eq(sl_cost_eval(&c, &plg, &gpu_hot, 16, 8, &e1), 0);
	ck_assert_double_eq_tol(e0.seconds, e1.seconds, 1e-15);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	Suite *s = suite_create("cost");
	TCase *tc = tcase_create("model");
	tcase_add_test(tc, test_hand_worked);
	tcase_add_test(tc, test_fit_scales_compute);
	tcase_add_test(tc, test_hand_worked_streamed);
	tcase_add_test(tc, test_hand_worked_halves);
	tcase_add_test(tc, test_hand_worked_disk);
	tcase_add_test(tc, test_hand_worked_zstd);
	suite_add_tcase(s, tc);
	TCase *tt = tcase_create("traffic");
	tcase_add_checked_fixture(tt, make_offdir, rm_offdir);
	tcase_set_timeout(tt, 120);
	tcase_add_loop_test(tt, test_traffic_counted, 0, (int)SL_ARRAY_LEN(traffic_grid));
	tcase_add_loop_test(tt, test_traffic_counted_rows_in_use, 0, 4);
	suite_add_tcase(s, tt);
	TCase *ts = tcase_create("search");
	tcase_set_timeout(ts, 120);
	tcase_add_test(ts, test_search_fits_and_ranks);
	tcase_add_test(ts, test_search_nothing_fits);
	tcase_add_test(ts, test_search_margin);
	tcase_add_test(ts, test_search_h2o);
	tcase_add_test(ts, test_search_compress);
	tcase_add_test(ts, test_search_compress_weight);
	tcase_add_test(tc, test_gemm_q4_rate);
	tcase_add_test(tc, test_gemm_shape_rate);
	tcase_add_test(tc, test_gemm_hot_micro_batches);
	suite_add_tcase(s, ts);
	return sl_test_run(s);
}
