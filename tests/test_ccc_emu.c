/*
 * test_ccc_emu.c - cpu_cache_compute on a backend whose device memory is
 * not host memory: the CUDA backend, here on the CPU emulation of CUDA
 * (kernels/cuda/emu; the same .cu code a GPU runs).
 *
 * With the KV cache in pinned host memory and cpu_cache_compute, decode
 * attention runs on a CPU backend over the host copy, and only the step's
 * q, k, v rows and the output cross the bus; the tokens must equal those of
 * the cache on the device with the CUDA attention (dense and H2O), and the
 * bytes moved must be far below the cache's.  The cache on the host and on
 * disk without cpu_cache_compute (staging, bounce buffers, the H2O
 * positions read back) must give the same tokens too.  And H2O scoring
 * on the CUDA backend, budgets of 0 among evicting ones in one block,
 * equals the independent PyTorch reference (tests/fixtures/h2o-score.json,
 * as tests/test_h2o.c checks it on the CPU backend).  argv[1]: the
 * fixtures folder.
 */
#include "backend.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "score.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *fixtures_dir = "tests/fixtures";
static char offdir[64]; /* the disk tier's folder */
static int np, plen[16];
static int32_t prompts[16][64];

typedef struct out {
	int32_t tokens[16][16];
	int ntok[16];
	sl_kv_stats kv;
} out;

enum { ACT_HOST = 1, WEIGHTS_DISK_SEP = 2 };

/* flags: activations in host memory; the weights on disk, streamed by
 * half layers (sep_layer) through the pinned bounce buffers */
static void run(double cg, double cc, bool ccc, bool h2o, int micro, unsigned flags, out *o)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_backend *be = NULL;
	ck_assert_msg(sl_backend_create("cuda", 1, &be) == 0, "%s", sl_errmsg());
	ck_assert(!be->ops->dev_is_host);
	sl_model *m = NULL;
	const bool wdisk = flags & WEIGHTS_DISK_SEP;
	int t = 0;
	for (int i = 0; i < np; i++)
		t = SL_MAX(t, plen[i]);
	/* the plan of this workload: np prompts up to t tokens, 8 new ones */
	sl_plan_params pp = sl_plan_defaults();
	pp.w_gpu = wdisk ? 0 : 100;
	pp.overlap = true;
	pp.sep_layer = wdisk;
	pp.cache_gpu = cg;
	pp.cache_cpu = cc;
	pp.cpu_cache_compute = ccc;
	pp.micro = micro;
	pp.act_host = flags & ACT_HOST;
	if (h2o)
		pp.hh = pp.rr = 0.2;
	pp.max_seq = np;
	pp.max_prompt = t;
	pp.max_len = t + 8;
	sl_model_params mp = { .dir = dir, .offload_dir = offdir, .plan = &pp };
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	sl_generator *g = NULL;
	ck_assert_msg(sl_generator_create(m, np, t + 8, t, &g) == 0, "%s", sl_errmsg());
	sl_seq seqs[16];
	for (int s = 0; s < np; s++)
		seqs[s] = (sl_seq){ .prompt = prompts[s], .prompt_len = plen[s], .max_new = 8,
				    .out = o->tokens[s] };
	sl_gen_timing tm = { 0 };
	ck_assert_msg(sl_generator_run(g, seqs, np, NULL, &tm) == 0, "%s", sl_errmsg());
	for (int s = 0; s < np; s++)
		o->ntok[s] = seqs[s].n_out;
	o->kv = m->kv_stats;
	sl_generator_free(g);
	sl_model_free(m);
	ck_assert_int_eq(be->dev_used, 0);
	ck_assert_int_eq(be->host_used, 0);
	sl_backend_free(be);
}

static void same(const out *a, const out *b, const char *what)
{
	for (int s = 0; s < np; s++)
		ck_assert_msg(a->ntok[s] == b->ntok[s] &&
				      !memcmp(a->tokens[s], b->tokens[s], sizeof(int32_t) * (size_t)a->ntok[s]),
			      "%s: tokens of sequence %d differ", what, s);
}

START_TEST(test_host_attention)
{
	const bool h2o = _i == 1;
	sl_test_prompts(fixtures_dir, "opt-pre", &np, plen, prompts);
	out dev, host, ccc, mixed, disk;
	run(100, 0, false, h2o, 0, 0, &dev);
	run(0, 100, false, h2o, 0, 0, &host);
	run(0, 100, true, h2o, 0, 0, &ccc);
	run(0, 0, false, h2o, 2, 0, &disk); /* through the pinned bounce buffers */
	same(&dev, &host, h2o ? "H2O, cache on the host" : "cache on the host");
	same(&dev, &disk, h2o ? "H2O, cache on disk" : "cache on disk");
	ck_assert(disk.kv.disk_read_bytes > 0 && disk.kv.disk_write_bytes > 0);
	same(&dev, &ccc, h2o ? "H2O, cpu_cache_compute" : "cpu_cache_compute");
	/* micro-batches of 2, each one on the device and one on the host */
	run(50, 50, true, h2o, 2, 0, &mixed);
	same(&dev, &mixed, h2o ? "H2O, half on the host, cpu_cache_compute" :
				 "half on the host, cpu_cache_compute");
	/* activations in pinned host memory, through the copy queue: in one
	 * micro-batch (the rows stay on the device for the whole pass) and in
	 * micro-batches of 2 (each step's rows loaded, prefetched, stored) */
	out act1, act2;
	run(100, 0, false, h2o, 0, ACT_HOST, &act1);
	same(&dev, &act1, h2o ? "H2O, activations on the host" : "activations on the host");
	run(0, 100, false, h2o, 2, ACT_HOST | WEIGHTS_DISK_SEP, &act2);
	same(&dev, &act2, h2o ? "H2O, activations and cache on the host, weights on disk by halves" :
				"activations and cache on the host, weights on disk by halves");
	/* the cache (and H2O's scores and positions) stays put: what crosses
	 * is a step's rows, not the cache */
	ck_assert_msg(ccc.kv.h2d_bytes * 2 < host.kv.h2d_bytes,
		      "cpu_cache_compute moved %llu bytes to the device, staging %llu",
		      (unsigned long long)ccc.kv.h2d_bytes, (unsigned long long)host.kv.h2d_bytes);
}
END_TEST

/* The fixture's block scored under its first case (H2O 20% + 20%: the
 * 1- to 4-token prompts have a budget of 0, the longer ones evict), with
 * the cache on the device and in host memory with cpu_cache_compute.  The
 * CUDA backend's cache is fp16: within 2e-3 of the fp32 reference (7.7e-4
 * measured; a token attended to or not moves a log-probability by far
 * more). */
START_TEST(test_h2o_score)
{
	char path[600], dir[600];
	snprintf(path, sizeof path, "%s/h2o-score.json", fixtures_dir);
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	json_error_t jerr;
	json_t *fx = json_load_file(path, 0, &jerr);
	ck_assert_msg(fx, "%s: %s", path, jerr.text);
	json_t *lines = json_object_get(fx, "lines"), *fcases = json_object_get(fx, "cases");
	const int n = (int)json_array_size(lines), nc = (int)json_array_size(fcases);
	ck_assert(n > 0 && n <= 16 && nc > 0);
	int32_t ids[16][64], cont[16][64];
	double lp[16][64];
	sl_score_seq seqs[16];
	int max_len = 0, max_prompt = 0;
	for (int i = 0; i < n; i++) {
		json_t *ln = json_array_get(lines, (size_t)i);
		json_t *a = json_object_get(ln, "input_ids"), *b = json_object_get(ln, "continuation_ids");
		seqs[i] = (sl_score_seq){ .prompt = ids[i], .cont = cont[i], .logprobs = lp[i],
					  .prompt_len = (int)json_array_size(a),
					  .cont_len = (int)json_array_size(b) };
		for (int j = 0; j < seqs[i].prompt_len; j++)
			ids[i][j] = (int32_t)json_integer_value(json_array_get(a, (size_t)j));
		for (int j = 0; j < seqs[i].cont_len; j++)
			cont[i][j] = (int32_t)json_integer_value(json_array_get(b, (size_t)j));
		max_len = SL_MAX(max_len, seqs[i].prompt_len + seqs[i].cont_len);
		max_prompt = SL_MAX(max_prompt, seqs[i].prompt_len);
	}
	for (int run = 0; run < 2; run++) {
		json_t *cs = json_array_get(fcases, 0);
		const double hh = json_real_value(json_object_get(cs, "hh_ratio")),
			     rr = json_real_value(json_object_get(cs, "recent_ratio"));
		const bool host = run % 2;
		sl_backend *be = NULL;
		ck_assert_msg(sl_backend_create("cuda", 1, &be) == 0, "%s", sl_errmsg());
		sl_model *m = NULL;
		sl_plan_params pp = sl_plan_defaults();
		pp.hh = hh;
		pp.rr = rr;
		pp.cache_gpu = host ? 0 : 100;
		pp.cache_cpu = host ? 100 : 0;
		pp.cpu_cache_compute = host;
		const sl_model_params mp = { .dir = dir, .plan = &pp };
		ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
		sl_scorer *sc = NULL;
		ck_assert_msg(sl_scorer_create(m, n, max_len, max_prompt, &sc) == 0, "%s", sl_errmsg());
		ck_assert_msg(sl_scorer_run(sc, seqs, n, NULL) == 0, "H2O %g/%g: %s", hh, rr, sl_errmsg());
		json_t *want = json_object_get(cs, "logprobs");
		for (int i = 0; i < n; i++)
			for (int j = 0; j < seqs[i].cont_len; j++) {
				const double w = json_real_value(
					json_array_get(json_array_get(want, (size_t)i), (size_t)j));
				ck_assert_msg(fabs(lp[i][j] - w) <= 2e-3 * fmax(1.0, fabs(w)),
					      "H2O %g/%g, cache %s: line %d token %d: %.6f, the reference %.6f", hh,
					      rr, host ? "on the host" : "on the device", i, j, lp[i][j], w);
			}
		sl_scorer_free(sc);
		sl_model_free(m);
		sl_backend_free(be);
	}
	json_decref(fx);
}
END_TEST

/* --threads reaches cpu_cache_compute: the CPU backend beside the device
 * that runs the host tier's decode attention has the threads the device's
 * backend was created with (1 and 3: at least one of them is not this
 * machine's core count, a CPU backend's default). */
START_TEST(test_host_attention_threads)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	for (int threads = 1; threads <= 3; threads += 2) {
		sl_backend *be = NULL;
		ck_assert_msg(sl_backend_create("cuda", threads, &be) == 0, "%s", sl_errmsg());
		sl_plan_params pp = sl_plan_defaults();
		pp.cache_gpu = 0;
		pp.cache_cpu = 100;
		pp.cpu_cache_compute = true;
		const sl_model_params mp = { .dir = dir, .plan = &pp };
		sl_model *m = NULL;
		ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
		sl_kv *kv = NULL;
		ck_assert_msg(sl_kv_create(&m->kv_env, 2, 16, &kv) == 0, "%s", sl_errmsg());
		const sl_backend *hb = sl_kv_host_backend(kv);
		ck_assert_ptr_nonnull(hb);
		ck_assert_msg(hb->nthreads == threads,
			      "the host attention's CPU backend has %d threads, --threads was %d",
			      hb->nthreads, threads);
		sl_kv_free(kv);
		sl_model_free(m);
		sl_backend_free(be);
	}
}
END_TEST

int main(int argc, char **argv)
{
	if (argc > 1)
		fixtures_dir = argv[1];
	snprintf(offdir, sizeof offdir, "/tmp/sluice-ccc-XXXXXX");
	if (!mkdtemp(offdir))
		return 1;
	Suite *s = suite_create("ccc_emu");
	TCase *tc = tcase_create("cpu_cache_compute");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, test_host_attention, 0, 2); /* dense, H2O */
	tcase_add_test(tc, test_host_attention_threads);
	suite_add_tcase(s, tc);
	TCase *th = tcase_create("h2o_score");
	tcase_set_timeout(th, 600);
	tcase_add_test(th, test_h2o_score);
	suite_add_tcase(s, th);
	int rc = sl_test_run(s);
	rmdir(offdir); /* the cache's scratch store is unlinked when opened */
	return rc;
}
