/*
 * test_plan.c - the run plan (runtime/plan.h): what a policy turns into,
 * the bounds it refuses, and a model opened under a plan holding jobs to
 * its workload.  That the plan's bytes are what the model and a job
 * allocate is checked over every placement in test_offload.c's grid (CPU
 * backend) and test_offload_emu.c (the emulated CUDA backend).
 */
#include "kvcache.h"
#include "model.h"
#include "plan.h"

#include <check.h>
#include <string.h>

static const char *fixtures_dir;

START_TEST(test_of_policy)
{
	sl_policy pol;
	sl_policy_default(&pol);
	pol.gpu_batch_size = 4;
	pol.w_gpu_percent = 20;
	pol.w_cpu_percent = 30;
	pol.cache_gpu_percent = 0;
	pol.cache_cpu_percent = 100;
	pol.act_gpu_percent = 0;
	pol.act_cpu_percent = 100;
	pol.hh_ratio = 0.1;
	pol.recent_ratio = -1; /* the same as hh_ratio */
	sl_plan_params p = sl_plan_of_policy(&pol, true, true);
	ck_assert(p.w_gpu == 20 && p.w_cpu == 30 && p.cache_gpu == 0 && p.cache_cpu == 100);
	ck_assert(p.act_host && p.kv_f32);
	ck_assert_int_eq(p.micro, 4);
	ck_assert(p.hh == 0.1 && p.rr == 0.1);
	ck_assert_int_eq(p.fixed_heavy, -1);
	ck_assert_int_eq(p.max_seq, 0); /* the workload is the job's */
	/* no policy given: the block is one micro-batch */
	p = sl_plan_of_policy(&pol, false, false);
	ck_assert_int_eq(p.micro, 0);
	ck_assert(!p.kv_f32);
	/* H2O off: both ratios 0 */
	pol.hh_ratio = 0;
	p = sl_plan_of_policy(&pol, false, false);
	ck_assert(p.hh == 0 && p.rr == 0);
}
END_TEST

START_TEST(test_bounds)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-125m", &c), 0);
	sl_plan pl;
	sl_plan_params p = sl_plan_defaults();
	p.w_gpu = 80;
	p.w_cpu = 30;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &pl), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "weight placement"), "%s", sl_errmsg());
	p = sl_plan_defaults();
	p.cache_gpu = -1;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &pl), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "cache placement"), "%s", sl_errmsg());
	p = sl_plan_defaults();
	p.max_seq = 2;
	p.max_prompt = 10;
	p.max_len = c.max_pos + 1;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &pl), SL_ERANGE);
	ck_assert_msg(strstr(sl_errmsg(), "positions"), "%s", sl_errmsg());
	p.max_len = 5; /* shorter than the prompt */
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &pl), SL_EINVAL);
	/* an open plan: the model's bytes only */
	p = sl_plan_defaults();
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &pl), 0);
	ck_assert(pl.weights.device > 0 && pl.cache.device == 0 && pl.act.device == 0);
	ck_assert_int_eq(pl.total.device, pl.weights.device);
}
END_TEST

/* What a plan says of its workload: micro-batches, slots, tiers. */
START_TEST(test_shape)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-125m", &c), 0);
	sl_plan_params p = sl_plan_defaults();
	p.max_seq = 8;
	p.max_prompt = 100;
	p.max_len = 132;
	p.micro = 2;
	sl_plan dense, h2o, host;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &dense), 0);
	ck_assert_int_eq(dense.gs, 2);
	ck_assert_int_eq(dense.cap, 132);
	ck_assert_int_eq(dense.max_rows, 8 * 132);
	ck_assert_int_eq(dense.group_rows, 2 * 132);
	ck_assert(!dense.h2o && dense.cache.host == 0 && dense.cache.disk == 0);
	p.hh = p.rr = 0.1; /* 10 + 10 tokens of a 100-token prompt, plus the new one */
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &h2o), 0);
	ck_assert(h2o.h2o);
	ck_assert_int_eq(h2o.cap, 21);
	ck_assert(h2o.cache.device < dense.cache.device);
	p.hh = p.rr = 0;
	p.cache_gpu = 0;
	p.cache_cpu = 100;
	p.w_gpu = 0;
	p.w_cpu = 100;
	ck_assert_int_eq(sl_plan_make(&c, &p, false, &host), 0);
	/* the host tier holds every layer's weights and the whole cache */
	ck_assert(host.weights.host >= (size_t)c.n_layer * sl_weights_layer_bytes(&c, false));
	ck_assert(host.cache.host >= 2 * (size_t)c.n_layer * 8 * 132 * c.hidden * 2);
	ck_assert(host.weights.device < dense.weights.device);
	ck_assert_int_eq(host.total.host, SL_MAX(host.weights_loading,
						 host.weights.host + host.cache.host + host.act.host));
}
END_TEST

/* sl_plan_min_device_bytes, the least device memory a workload runs in
 * under any placement of weights and cache (what the command line admits
 * a job's --gpu-mem against), is at most every placement's device total,
 * with its schedule's switches: so a policy whose plan fits a budget is
 * never refused by that check. */
START_TEST(test_min_device)
{
	static const char *const models[] = { "opt-125m", "opt-1.3b" };
	static const double w[][2] = { { 0, 100 }, { 0, 0 }, { 10, 90 }, { 50, 30 }, { 100, 0 } };
	static const double kv[][2] = { { 0, 100 }, { 0, 0 }, { 100, 0 }, { 50, 50 } };
	for (size_t mi = 0; mi < 2; mi++) {
		sl_model_config c;
		ck_assert_int_eq(sl_model_config_named(models[mi], &c), 0);
		for (int sw = 0; sw < 16; sw++) {
			sl_plan_params p = sl_plan_defaults();
			p.max_seq = 24;
			p.micro = 8;
			p.max_prompt = 40;
			p.max_len = 48;
			p.sep_layer = sw & 1;
			p.overlap = sw & 2;
			p.cpu_cache_compute = sw & 4;
			p.hh = p.rr = sw & 8 ? 0.0125 : 0;
			for (int host = 0; host < 2; host++) {
			const size_t least = sl_plan_min_device_bytes(&c, &p, host);
			for (size_t wi = 0; wi < SL_ARRAY_LEN(w); wi++)
				for (size_t ki = 0; ki < SL_ARRAY_LEN(kv); ki++) {
					p.w_gpu = w[wi][0];
					p.w_cpu = w[wi][1];
					p.cache_gpu = kv[ki][0];
					p.cache_cpu = kv[ki][1];
					sl_plan pl;
					ck_assert_int_eq(sl_plan_make(&c, &p, host, &pl), 0);
					ck_assert_msg(least <= pl.total.device,
						      "%s host %d switches %d weights %g/%g cache %g/%g: least %zu > plan %zu",
						      models[mi], host, sw, w[wi][0], w[wi][1], kv[ki][0], kv[ki][1],
						      least, pl.total.device);
				}
			}
		}
	}
}
END_TEST

/* A model opened under a plan with a workload refuses a larger job, and
 * makes its workspace for the plan, not for the job. */
START_TEST(test_workload_held)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_plan_params pp = sl_plan_defaults();
	pp.max_seq = 4;
	pp.max_prompt = 8;
	pp.max_len = 16;
	const sl_model_params mp = { .dir = dir, .plan = &pp };
	sl_model *m = NULL;
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	sl_kv *kv = NULL;
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 5, 8, 16, &kv), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "larger than the run plan"), "%s", sl_errmsg());
	ck_assert_ptr_null(kv);
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 4, 9, 16, &kv), SL_EINVAL);
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 4, 8, 17, &kv), SL_EINVAL);
	ck_assert_int_eq(sl_model_reserve(m, 5, 5), SL_EINVAL);
	ck_assert_int_eq(sl_model_reserve(m, 4, 4 * 16 + 1), SL_EINVAL);
	/* a smaller job runs in the plan's workspace */
	ck_assert_int_eq(sl_kv_make(&m->kv_env, 2, 3, 6, &kv), 0);
	ck_assert_int_eq(sl_model_reserve(m, 2, 6), 0);
	ck_assert_int_eq(m->max_seq, 4);
	ck_assert_int_eq(m->max_rows, 64);
	sl_kv_free(kv);
	sl_model_free(m);
	ck_assert_int_eq(be->dev_used, 0);
	sl_backend_free(be);
}
END_TEST

/* An open plan with micro-batches: a later block of fewer, longer
 * sequences gets micro-batch buffers for its rows (it used to reuse the
 * earlier block's, too small, and write past them). */
START_TEST(test_open_regrow)
{
	char dir[600];
	snprintf(dir, sizeof dir, "%s/opt-pre", fixtures_dir);
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	sl_plan_params pp = sl_plan_defaults();
	pp.micro = 2;
	const sl_model_params mp = { .dir = dir, .plan = &pp };
	sl_model *m = NULL;
	ck_assert_msg(sl_model_open_ex(be, &mp, &m) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sl_model_reserve(m, 8, 8 * 4), 0);
	ck_assert_int_ge(m->group_rows, 2 * 4);
	ck_assert_int_eq(sl_model_reserve(m, 2, 2 * 16), 0);
	ck_assert_int_ge(m->group_rows, 2 * 16);
	ck_assert_int_ge(m->max_rows, 2 * 16);
	sl_model_free(m);
	sl_backend_free(be);
}
END_TEST

/* compress_weight: the plan's weight bytes are the compressed ones in
 * every tier (each layer matrix sl_q4_bytes: 36 bytes a 64 values of a row,
 * written out here), so budgets, --batch max and admission see them; the
 * globals (embeddings, head) stay fp16; the policy field sets it.  And a
 * device budget that refuses the fp16 weights admits the 4-bit ones when
 * the model opens. */
START_TEST(test_compressed_weights)
{
	sl_model_config c;
	ck_assert_int_eq(sl_model_config_named("opt-125m", &c), 0);
	const size_t h = 768, f = 3072, L = 12;
	const size_t f16 = 4 * h * h * 2 + 2 * f * h * 2;
	const size_t q4 = 4 * h * (h / 64) * 36 + f * (h / 64) * 36 + h * (f / 64) * 36;
	static const double pl[][2] = { { 100, 0 }, { 0, 100 }, { 0, 0 } };
	for (int i = 0; i < 3; i++) {
		sl_plan_params p = sl_plan_defaults();
		p.w_gpu = pl[i][0];
		p.w_cpu = pl[i][1];
		sl_plan a, b;
		ck_assert_int_eq(sl_plan_make(&c, &p, true, &a), 0);
		p.w_q4 = true;
		ck_assert_int_eq(sl_plan_make(&c, &p, true, &b), 0);
		/* every tensor in one tier here, so the layer's homes shrink by
		 * the matrices' difference (all multiples of 64 bytes at these
		 * shapes); the disk segment is page aligned */
		const size_t saved = L * (f16 - q4);
		if (i == 0)
			ck_assert_uint_eq(a.weights.device - b.weights.device, saved);
		if (i == 1) {
			ck_assert_uint_eq(a.weights.host - b.weights.host, saved);
			/* the CPU backend reads the host tier in place: no
			 * staging slot, the globals alone on the device */
			ck_assert_uint_eq(a.weights.device, sl_weights_global_bytes(&c));
			ck_assert_uint_eq(b.weights.device, a.weights.device);
			/* a GPU's staging slots hold one layer's streamed bytes each */
			sl_plan ga, gb;
			ck_assert_int_eq(sl_plan_make(&c, &p, false, &gb), 0);
			p.w_q4 = false;
			ck_assert_int_eq(sl_plan_make(&c, &p, false, &ga), 0);
			ck_assert_uint_lt(gb.weights.device, ga.weights.device);
			ck_assert_uint_ge(ga.weights.device - gb.weights.device, 2 * (f16 - q4) - 2 * 4096);
		}
		if (i == 2) {
			const size_t seg16 = a.weights.disk / L, seg4 = b.weights.disk / L;
			ck_assert_uint_eq(seg16 % 4096, 0);
			ck_assert_uint_eq(seg4 % 4096, 0);
			ck_assert_uint_lt(seg4, seg16);
			ck_assert_uint_le(seg16 - seg4, f16 - q4 + 8192);
			ck_assert_uint_ge(seg16 - seg4 + 8192, f16 - q4);
		}
	}
	sl_policy pol;
	sl_policy_default(&pol);
	pol.compress_weight = true;
	ck_assert(sl_plan_of_policy(&pol, false, false).w_q4);

	/* the model under a device budget between the two */
	sl_plan_params p = sl_plan_defaults();
	p.max_seq = 1;
	p.max_prompt = 4;
	p.max_len = 4;
	sl_plan a, b;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &a), 0);
	p.w_q4 = true;
	ck_assert_int_eq(sl_plan_make(&c, &p, true, &b), 0);
	const size_t budget = b.total.device;
	ck_assert_uint_lt(budget, a.total.device);
	for (int q = 0; q < 2; q++) {
		p.w_q4 = q;
		sl_backend *be = NULL;
		ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
		sl_backend_set_dev_limit(be, budget);
		const sl_model_params mp = { .dummy = "opt-125m", .plan = &p };
		sl_model *m = NULL;
		const int rc = sl_model_open_ex(be, &mp, &m);
		if (q) {
			ck_assert_msg(rc == 0, "4-bit weights under %zu: %s", budget, sl_errmsg());
			ck_assert_uint_eq(be->dev_peak, b.weights.device); /* the job's part comes with a job */
		} else {
			ck_assert_int_eq(rc, SL_EBUDGET);
		}
		sl_model_free(m);
		sl_backend_free(be);
	}
}
END_TEST

int main(int argc, char **argv)
{
	fixtures_dir = argc > 1 ? argv[1] : "tests/fixtures";
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("plan");
	tcase_add_test(tc, test_of_policy);
	tcase_add_test(tc, test_bounds);
	tcase_add_test(tc, test_shape);
	tcase_add_test(tc, test_min_device);
	tcase_add_test(tc, test_workload_held);
	tcase_add_test(tc, test_open_regrow);
	tcase_add_test(tc, test_compressed_weights);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? 1 : 0;
}
