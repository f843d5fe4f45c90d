/*
 * cli_job.c - the two job commands' shared part (sluice generate, sluice
 * score): their options, the checks before compute, the run, and what an
 * interruption or a failure leaves in the output.
 */
#include "cli.h"
#include "cost.h"
#include "jsonl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void catch_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

bool job_opt(const char *cmd, int c, job_cli *j)
{
	if (common_opt(cmd, c, &j->co))
		return true;
	switch (c) {
	case 'o': j->out = optarg; return true;
	case 'b':
		j->jo.batch = parse_int(cmd, "--batch-size", optarg, 1, 1 << 16);
		j->batch_given = true;
		return true;
	case OPT_OVERWRITE: j->overwrite = true; return true;
	case OPT_RESUME: j->resume = true; return true;
	case OPT_QUIET: j->quiet = true; return true;
	case OPT_STATS: j->stats = optarg; return true;
	case OPT_SKIP_BAD: j->skip_bad = true; return true;
	case OPT_TRUNCATE:
		if (strcmp(optarg, "left"))
			usage_error(cmd, "--truncate takes 'left', got '%s'", optarg);
		j->truncate_left = true;
		return true;
	case OPT_SHARD: {
		int k = -1, n = -1, used = 0;
		if (sscanf(optarg, "%d/%d%n", &k, &n, &used) != 2 || optarg[used] || n < 1 || k < 0 ||
		    k >= n)
			usage_error(cmd, "--shard takes K/N with 0 <= K < N, got '%s'", optarg);
		j->jo.shard_k = k;
		j->jo.shard_n = n;
		return true;
	}
	default: return false;
	}
}

/* Check lengths against the model's positions (or cut prompts from the
 * left); extra is each line's tokens after the prompt. */
static int fit_prompts(sl_prompts *ps, const char *in, int max_pos, bool truncate_left,
		       int default_new, bool score)
{
	for (int i = 0; i < ps->n; i++) {
		sl_prompt *p = &ps->p[i];
		if (p->error)
			continue;
		int extra = score ? p->ncont : (p->max_new ? p->max_new : default_new);
		if (p->n + extra <= max_pos)
			continue;
		if (!truncate_left || extra >= max_pos)
			return sl_err(SL_ERANGE,
				      "%s:%d: prompt of %d tokens plus %d %s exceeds the model's %d positions%s",
				      in, p->line, p->n, extra, score ? "continuation tokens" : "new tokens",
				      max_pos, truncate_left ? "" : " (--truncate left cuts prompts)");
		int keep = max_pos - extra;
		memmove(p->ids, p->ids + (p->n - keep), sizeof(int32_t) * (size_t)keep);
		p->n = keep;
	}
	return 0;
}

/* A line's new tokens: generate's max_new_tokens, score's continuation. */
static int line_gen(const job_cli *j, const sl_prompt *p, bool score)
{
	return score ? p->ncont : (p->max_new ? p->max_new : j->jo.max_new);
}

/* The prediction of a block of ns sequences whose longest prompt is mp
 * tokens and whose longest generation g (within the model's positions). */
static int block_cost(const job_cli *j, const sl_model_config *cfg, bool dev_is_host,
		      const sl_profile *prof, int ns, int mp, int g, sl_cost *c)
{
	g = SL_MAX(1, SL_MIN(g, cfg->max_pos - mp));
	const sl_plan_params pp = job_plan(&j->co, ns, ns * (mp + g), mp + g, mp);
	return predict_run(cfg, &pp, dev_is_host, prof, mp, g, c);
}

/*
 * The cost model's prediction of the blocks the job ran (this shard's,
 * after the resumed ones): each block predicted with its own sequences,
 * longest prompt and most new tokens (block_cost), and summed; the
 * throughput is the predicted tokens (each block's sequences x its new
 * tokens) over the predicted seconds.  Consecutive blocks of one shape are
 * predicted once.
 */
static int predict_job(const job_cli *j, const sl_model_config *cfg, bool dev_is_host,
		       const sl_profile *prof, const sl_prompts *ps, bool score, sl_job_stats *st)
{
	const sl_job_opts *o = &j->jo;
	const int batch = o->batch;
	int skip = st->resumed_lines, kns = -1, kp = -1, kg = -1;
	double prefill = 0, decode = 0, tokens = 0;
	sl_cost c = { 0 };
	for (int b = 0; b * batch < ps->n; b++) {
		if (o->shard_n > 1 && b % o->shard_n != o->shard_k)
			continue;
		const int first = b * batch, count = SL_MIN(batch, ps->n - first);
		if (skip > 0) { /* resumed blocks are whole */
			skip -= count;
			continue;
		}
		int ns = 0, mp = 0, g = 0;
		for (int i = first; i < first + count; i++) {
			const sl_prompt *p = &ps->p[i];
			if (p->error)
				continue;
			ns++;
			mp = SL_MAX(mp, p->n);
			g = SL_MAX(g, line_gen(j, p, score));
		}
		if (!ns)
			continue;
		if (ns != kns || mp != kp || g != kg) {
			SL_TRY(block_cost(j, cfg, dev_is_host, prof, ns, mp, g, &c));
			kns = ns, kp = mp, kg = g;
		}
		prefill += c.prefill.seconds;
		decode += c.decode.seconds;
		tokens += (double)ns * c.gen_len;
	}
	st->predicted = true;
	st->pred_prefill_s = prefill;
	st->pred_decode_s = decode;
	st->pred_tok_s = prefill + decode > 0 ? tokens / (prefill + decode) : 0;
	return 0;
}

int run_job(const char *cmd, job_cli *j, bool score)
{
	if (!j->in || !j->out)
		usage_error(cmd, "%s", score ? "--input and --out are required"
					     : "--prompts and --out are required");
	check_model_opts(cmd, &j->co);
	if (j->overwrite && j->resume)
		usage_error(cmd, "%s", "--overwrite and --resume exclude each other");
	const bool out_std = !strcmp(j->out, "-");
	if (out_std && j->resume)
		usage_error(cmd, "%s", "--resume needs --out FILE (standard output has no .partial to continue)");
	if (j->co.policy_given && !j->batch_given)
		j->jo.batch = (int)sl_policy_batch(&j->co.policy);
	j->jo.stats_path = j->stats;
	j->jo.resume = j->resume;
	j->jo.progress = j->quiet ? 0 : isatty(STDERR_FILENO) ? 2 : 1;
	j->jo.interrupt = &interrupted;
	j->co.interrupt = &interrupted;
	catch_signals();

	/* everything that can be checked before compute is checked first:
	 * every output path, then the model's shapes, the tokenizer and the
	 * input, all before any weight is read */
	bool complete = false;
	sl_output *out = NULL;
	int rc = sl_output_open(j->out, j->resume ? SL_OUT_RESUME
				: j->overwrite ? SL_OUT_OVERWRITE : SL_OUT_NEW, &out, &complete);
	if (rc < 0)
		die(rc);
	sl_backend *be = NULL;
	sl_model *m = NULL;
	sl_tokenizer *tok = NULL;
	sl_prompts ps = { 0 };
	sl_job_stats st = { 0 };
	if (j->stats && (rc = sl_job_check_stats_path(j->stats)) < 0)
		goto fail;
	sl_model_config cfg;
	if ((rc = model_config(&j->co, &cfg)) < 0)
		goto fail;
	/* the folder's tokenizer when it has one (tokenizer.h says which
	 * file wins); without one, prompts must be input_ids */
	if (j->co.model_dir && sl_tokenizer_present(j->co.model_dir) &&
	    (rc = sl_tokenizer_load(j->co.model_dir, &tok)) < 0)
		goto fail;
	sl_read_opts ro = { .vocab = cfg.vocab, .tok = tok, .score = score,
			    .skip_bad_lines = j->skip_bad };
	if ((rc = sl_prompts_read(j->in, &ro, &ps)) < 0)
		goto fail;
	const char *in_name = strcmp(j->in, "-") ? j->in : "<stdin>";
	if ((rc = fit_prompts(&ps, in_name, cfg.max_pos, j->truncate_left, j->jo.max_new, score)) < 0)
		goto fail;
	if (complete) {
		/* a finished output: nothing to resume if it is this input's */
		if ((rc = sl_job_check_complete(&ps, out, &j->jo)) < 0)
			goto fail;
		if (!j->quiet)
			fprintf(stderr, "sluice: %s is complete already; nothing to resume\n", j->out);
		sl_output_close(out, false);
		sl_prompts_free(&ps);
		sl_tokenizer_free(tok);
		return 0;
	}
	int max_len = 1, max_prompt = 1, max_gen = 1;
	for (int i = 0; i < ps.n; i++) {
		const sl_prompt *p = &ps.p[i];
		if (p->error)
			continue;
		int extra = line_gen(j, p, score);
		max_len = SL_MAX(max_len, p->n + extra);
		max_prompt = SL_MAX(max_prompt, p->n);
		max_gen = SL_MAX(max_gen, extra);
	}
	if ((rc = make_backend(&j->co, &be)) < 0)
		goto fail;
	/* a profile at hand predicts the run (never measured for it; --policy
	 * auto's search measures one where none is at hand) */
	sl_profile prof;
	bool have_prof = false;
	if (j->co.policy_auto) {
		/* the block: the search's choice, at most the input's lines
		 * (and --batch-size where given) */
		int cap = j->batch_given ? SL_MIN(j->jo.batch, ps.n) : ps.n;
		if ((rc = policy_auto(&j->co, &cfg, be->ops->name, max_prompt, max_gen, SL_MAX(cap, 1),
				      j->quiet, &prof)) < 0)
			goto fail;
		j->jo.batch = (int)sl_policy_batch(&j->co.policy);
		have_prof = true;
	} else if (j->stats && (rc = cli_profile(&j->co, &cfg, be->ops->name, false, &prof, &have_prof)) < 0) {
		goto fail;
	}
	const int nseq = SL_MIN(j->jo.batch, ps.n);
	if ((rc = find_zstd_store(&j->co)) < 0)
		goto fail;
	const sl_plan_params pp = job_plan(&j->co, nseq, nseq * max_len, max_len, max_prompt);
	if ((rc = check_budget(&j->co, &cfg, &pp, be->ops->dev_is_host)) < 0)
		goto fail;
	sl_cost pc; /* the largest block's shape, before compute */
	if (have_prof && (rc = block_cost(j, &cfg, be->ops->dev_is_host, &prof, nseq, max_prompt,
					  max_gen, &pc)) < 0)
		goto fail;
	if ((rc = open_model(&j->co, &cfg, &pp, &be, &m)) < 0) {
		budget_hint(rc, &j->co, &cfg, be, &pp);
		goto fail;
	}
	rc = score ? sl_job_score(m, &ps, out, &j->jo, &st)
		   : sl_job_generate(m, tok, &ps, out, &j->jo, &st);
	computing = st.started;
	if (rc < 0) {
		budget_hint(rc, &j->co, &cfg, be, &pp);
		goto fail;
	}
	/* the shapes were predicted before compute: a failure here leaves
	 * the prediction out (null), never the job's output */
	if (have_prof && predict_job(j, &cfg, be->ops->dev_is_host, &prof, &ps, score, &st) < 0)
		st.predicted = false;
	sl_output_close(out, false);
	out = NULL;
	rc = sl_job_report(&st, &j->jo, cmd, j->quiet, be->ops->name);
	sl_prompts_free(&ps);
	sl_tokenizer_free(tok);
	sl_model_free(m);
	sl_backend_free(be);
	if (rc < 0)
		die(rc);
	return 0;
fail:
	if (rc == SL_EINTERRUPTED && !st.started && !j->resume) {
		/* before the first block (loading the weights, say): nothing
		 * to continue, so nothing is left */
		fprintf(stderr, "sluice: %s; no output was written\n", sl_errmsg());
		sl_output_close(out, true);
		exit(EXIT_INTERRUPTED);
	}
	if (rc == SL_EINTERRUPTED) {
		if (out_std)
			fprintf(stderr, "sluice: interrupted: %d of %d prompts were written to standard output\n",
				st.done, st.prompts);
		else
			fprintf(stderr,
				"sluice: interrupted: %d of %d prompts are in %s.partial; run the same command with --resume to continue\n",
				st.done, st.prompts, j->out);
		sl_output_close(out, false);
		exit(EXIT_INTERRUPTED);
	}
	/* keep whole blocks already written for --resume; otherwise leave nothing */
	bool keep = !complete && (st.done > st.resumed_lines || j->resume);
	if (keep && out_std)
		sl_err_prefix(rc, "%d of %d prompts were written to standard output", st.done, st.prompts);
	else if (keep)
		sl_err_prefix(rc, "%d of %d prompts are in %s.partial (--resume continues)", st.done,
			      st.prompts, j->out);
	sl_output_close(out, !keep);
	sl_prompts_free(&ps);
	sl_tokenizer_free(tok);
	sl_model_free(m);
	sl_backend_free(be);
	die(rc);
	return 1;
}
