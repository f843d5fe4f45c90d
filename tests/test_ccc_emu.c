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
 * positions read back) must give the same tokens too.  argv[1]: the
 * fixtures folder.
 */
#include "backend.h"
#include "generate.h"
#include "model.h"

#include "testutil.h"

#include <check.h>
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
	sl_model_params mp = { .dir = dir, .w_gpu_percent = wdisk ? 0 : 100, .offload_dir = offdir,
			       .overlap = true, .sep_layer = wdisk };
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	m->cache_gpu_percent = cg;
	m->cache_cpu_percent = cc;
	m->cpu_cache_compute = ccc;
	m->micro = micro;
	m->act_host = flags & ACT_HOST;
	if (h2o)
		m->hh_ratio = m->recent_ratio = 0.2;
	int t = 0;
	for (int i = 0; i < np; i++)
		t = SL_MAX(t, plen[i]);
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
	suite_add_tcase(s, tc);
	int rc = sl_test_run(s);
	rmdir(offdir); /* the cache's scratch store is unlinked when opened */
	return rc;
}
