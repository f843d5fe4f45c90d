/*
 * test_policy.c - the policy module and its file format.
 *
 * The field names, kinds, bounds and defaults are written out again here
 * (spec[]) from the brief, independently of the table in policy.c, and every
 * check walks them: defaults; every bound of every numeric field, through a
 * file, a struct and a flag; every wrong JSON type; unknown fields and typo
 * suggestions; the rules across fields; malformed files (line numbers, not an
 * object, missing, a directory); exact save -> load round trips; atomic saves
 * (no .tmp left, stale .tmp and symlinks, a reader never sees a partial file);
 * --percent; set() for every field; print, usage and the Markdown reference.
 * argv[1], optional: docs/policy.md, which must equal what policy_doc writes.
 *
 * Over 800 lines on purpose: the independent spec[] table and every
 * check that walks it; splitting would copy the table or hide it in a
 * header shared by one test.
 */
#define _POSIX_C_SOURCE 200809L
#include "policy.h"
#include "sl_common.h"

#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];
static const char *doc_path;

/* ---- the spec, independent of policy.c ------------------------------------- */

typedef struct spec_t {
	const char *name;
	char kind; /* 'i' int, 'n' number, 'b' bool */
	double min, max, def;
} spec_t;

static const spec_t spec[] = {
	{ "gpu_batch_size", 'i', 1, 65536, 8 },
	{ "num_gpu_batches", 'i', 1, 4096, 1 },
	{ "w_gpu_percent", 'n', 0, 100, 100 },
	{ "w_cpu_percent", 'n', 0, 100, 0 },
	{ "cache_gpu_percent", 'n', 0, 100, 100 },
	{ "cache_cpu_percent", 'n', 0, 100, 0 },
	{ "act_gpu_percent", 'n', 0, 100, 100 },
	{ "act_cpu_percent", 'n', 0, 100, 0 },
	{ "overlap", 'b', 0, 1, 1 },
	{ "sep_layer", 'b', 0, 1, 1 },
	{ "pin_weight", 'b', 0, 1, 1 },
	{ "cpu_cache_compute", 'b', 0, 1, 0 },
	{ "compress_weight", 'b', 0, 1, 0 },
	{ "compress_cache", 'b', 0, 1, 0 },
	{ "hh_ratio", 'n', 0, 1, 0 },
	{ "recent_ratio", 'n', -1, 1, -1 },
};
#define NSPEC (sizeof spec / sizeof spec[0])

static double get(const sl_policy *p, const char *n)
{
#define G(m)                 \
	if (!strcmp(n, #m))  \
		return p->m;
	G(gpu_batch_size) G(num_gpu_batches) G(w_gpu_percent) G(w_cpu_percent)
	G(cache_gpu_percent) G(cache_cpu_percent) G(act_gpu_percent) G(act_cpu_percent)
	G(overlap) G(sep_layer) G(pin_weight) G(cpu_cache_compute) G(compress_weight)
	G(compress_cache) G(hh_ratio) G(recent_ratio)
#undef G
	ck_abort_msg("no field %s", n);
	return 0;
}

static void put(sl_policy *p, const char *n, double v)
{
#define PI(m)                                    \
	if (!strcmp(n, #m)) {                    \
		p->m = (int)v;                   \
		return;                          \
	}
#define PD(m)                                    \
	if (!strcmp(n, #m)) {                    \
		p->m = v;                        \
		return;                          \
	}
#define PB(m)                                    \
	if (!strcmp(n, #m)) {                    \
		p->m = v != 0;                   \
		return;                          \
	}
	PI(gpu_batch_size) PI(num_gpu_batches) PD(w_gpu_percent) PD(w_cpu_percent)
	PD(cache_gpu_percent) PD(cache_cpu_percent) PD(act_gpu_percent) PD(act_cpu_percent)
	PB(overlap) PB(sep_layer) PB(pin_weight) PB(cpu_cache_compute) PB(compress_weight)
	PB(compress_cache) PD(hh_ratio) PD(recent_ratio)
#undef PI
#undef PD
#undef PB
	ck_abort_msg("no field %s", n);
}

/* Exact, bit-for-bit equality over every member. */
static void ck_same(const sl_policy *a, const sl_policy *b)
{
	for (size_t i = 0; i < NSPEC; i++) {
		double x = get(a, spec[i].name), y = get(b, spec[i].name);
		ck_assert_msg(memcmp(&x, &y, sizeof x) == 0, "%s: %.17g != %.17g", spec[i].name, x, y);
	}
	ck_assert(sl_policy_equal(a, b));
}

/* ---- helpers ------------------------------------------------------------------ */

static const char *tpath(char buf[512], const char *name)
{
	snprintf(buf, 512, "%s/%s", tmpdir, name);
	return buf;
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f, "cannot write %s", path);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *s = malloc(cap);
	ck_assert(s);
	size_t r;
	while ((r = fread(s + n, 1, cap - 1 - n, f)) > 0) {
		n += r;
		if (n + 1 >= cap) {
			cap *= 2;
			s = realloc(s, cap);
			ck_assert(s);
		}
	}
	fclose(f);
	s[n] = 0;
	return s;
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

/* The message contains every NULL-terminated needle. */
static void ck_msg_has(const char *first, ...)
{
	const char *msg = sl_errmsg();
	va_list ap;
	va_start(ap, first);
	for (const char *s = first; s; s = va_arg(ap, const char *))
		ck_assert_msg(strstr(msg, s), "message '%s' lacks '%s'", msg, s);
	va_end(ap);
}

static void ck_one_line(void)
{
	ck_assert_msg(!strchr(sl_errmsg(), '\n'), "message has a newline: '%s'", sl_errmsg());
}

/* Load text from a fresh file; expect code; the message names the file and the needles. */
static int load_text(const char *name, const char *text, sl_policy *p)
{
	char path[512];
	write_text(tpath(path, name), text);
	sl_err_clear();
	return sl_policy_load(path, p);
}

#define BAD_LOAD(name, text, code, ...)                                                        \
	do {                                                                                   \
		char bl_path_[512];                                                            \
		sl_policy bl_p_, bl_keep_;                                                     \
		sl_policy_default(&bl_p_);                                                     \
		bl_p_.gpu_batch_size = 3; /* not the default: must survive the failure */     \
		bl_keep_ = bl_p_;                                                              \
		int bl_rc_ = load_text(name, text, &bl_p_);                                    \
		ck_assert_msg(bl_rc_ == (code), "%s: rc %d (%s), want %d; text %s", name, bl_rc_, \
			      sl_errmsg(), code, text);                                        \
		ck_msg_has(tpath(bl_path_, name), __VA_ARGS__, (const char *)NULL);            \
		ck_one_line();                                                                 \
		ck_same(&bl_p_, &bl_keep_);                                                    \
	} while (0)

static const char *fmtd(char buf[64], double v)
{
	snprintf(buf, 64, "%.17g", v);
	return buf;
}

/* ---- defaults and validation ------------------------------------------------ */

START_TEST(defaults)
{
	sl_policy p;
	memset(&p, 0x5a, sizeof p);
	sl_policy_default(&p);
	for (size_t i = 0; i < NSPEC; i++)
		ck_assert_msg(get(&p, spec[i].name) == spec[i].def, "%s default %g, want %g",
			      spec[i].name, get(&p, spec[i].name), spec[i].def);
	ck_assert_int_eq(sl_policy_validate(&p, "x.json"), 0);
	ck_assert_int_eq(sl_policy_validate(&p, NULL), 0);
	ck_assert_uint_eq(sl_policy_batch(&p), 8);
	ck_assert(sl_policy_recent_ratio(&p) == 0);
	p.gpu_batch_size = 52;
	p.num_gpu_batches = 8;
	ck_assert_uint_eq(sl_policy_batch(&p), 416);
	p.gpu_batch_size = 65536;
	p.num_gpu_batches = 4096;
	ck_assert_uint_eq(sl_policy_batch(&p), (size_t)65536 * 4096);
	p.hh_ratio = 0.1;
	ck_assert(sl_policy_recent_ratio(&p) == 0.1);
	p.recent_ratio = 0.3;
	ck_assert(sl_policy_recent_ratio(&p) == 0.3);
}
END_TEST

/* Every numeric field just outside each bound, in the struct. */
START_TEST(validate_bounds)
{
	char lo[64], hi[64];
	for (size_t i = 0; i < NSPEC; i++) {
		const spec_t *s = &spec[i];
		if (s->kind == 'b')
			continue;
		double d = s->kind == 'i' ? 1 : 1e-6;
		double bad[] = { s->min - d, s->max + d, NAN };
		for (int k = 0; k < (s->kind == 'i' ? 2 : 3); k++) {
			sl_policy p;
			sl_policy_default(&p);
			put(&p, s->name, bad[k]);
			sl_err_clear();
			ck_assert_int_eq(sl_policy_validate(&p, "somewhere.json"), SL_ERANGE);
			snprintf(lo, sizeof lo, "[%g, %g]", s->min, s->max);
			ck_msg_has("somewhere.json", s->name, lo, (const char *)NULL);
		}
		(void)hi;
	}
}
END_TEST

START_TEST(validate_relations)
{
	sl_policy p;
	struct {
		double wg, wc, cg, cc, ag, ac;
		bool cc_comp;
		double hh, rr;
		int code;
		const char *needle;
	} cases[] = {
		{ 100, 0, 100, 0, 100, 0, false, 0, -1, 0, NULL },
		{ 20, 80, 0, 100, 0, 100, false, 0, -1, 0, NULL },
		{ 0, 0, 0, 0, 0, 0, false, 0, -1, 0, NULL }, /* all on disk */
		{ 33.3, 66.7, 50, 50, 100, 0, false, 0, -1, 0, NULL },
		{ 90, 40, 100, 0, 100, 0, false, 0, -1, SL_ERANGE, "w_gpu_percent + w_cpu_percent = 130, must be at most 100" },
		{ 100, 0, 60, 60, 100, 0, false, 0, -1, SL_ERANGE, "cache_gpu_percent + cache_cpu_percent = 120" },
		{ 100, 0, 100, 0, 60, 60, false, 0, -1, SL_ERANGE, "act_gpu_percent + act_cpu_percent = 120" },
		{ 100, 0, 100, 0, 50, 50, false, 0, -1, SL_EUNSUPPORTED, "act_gpu_percent = 50, act_cpu_percent = 50" },
		{ 100, 0, 100, 0, 50, 0, false, 0, -1, SL_EUNSUPPORTED, "act_gpu_percent" },
		{ 100, 0, 100, 0, 0, 30, false, 0, -1, SL_EUNSUPPORTED, "act_cpu_percent" },
		{ 100, 0, 100, 0, 0, 100, false, 0, -1, 0, NULL },
		/* a compressed cache split over tiers: sluice splits by sequence */
		{ 100, 0, 50, 50, 100, 0, true, 0, -1, 0, NULL },
		{ 100, 0, 30, 20, 100, 0, true, 0, -1, 0, NULL },
		{ 100, 0, 0, 100, 100, 0, true, 0, -1, 0, NULL },
		{ 100, 0, 0, 0, 100, 0, true, 0, -1, 0, NULL },
		{ 100, 0, 100, 0, 100, 0, false, 0.5, -1, 0, NULL },
		{ 100, 0, 100, 0, 100, 0, false, 0.6, -1, SL_ERANGE, "hh_ratio + recent_ratio" },
		{ 100, 0, 100, 0, 100, 0, false, 0.6, 0.4, 0, NULL },
		{ 100, 0, 100, 0, 100, 0, false, 1, 0, 0, NULL },
		{ 100, 0, 100, 0, 100, 0, false, 0.5, 0.6, SL_ERANGE, "hh_ratio + recent_ratio = 1.1" },
		{ 100, 0, 100, 0, 100, 0, false, 0, 0.2, 0, NULL }, /* recent-only window */
		{ 100, 0, 100, 0, 100, 0, false, 0, 0, 0, NULL },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		sl_policy_default(&p);
		p.w_gpu_percent = cases[i].wg;
		p.w_cpu_percent = cases[i].wc;
		p.cache_gpu_percent = cases[i].cg;
		p.cache_cpu_percent = cases[i].cc;
		p.act_gpu_percent = cases[i].ag;
		p.act_cpu_percent = cases[i].ac;
		p.compress_cache = cases[i].cc_comp;
		p.hh_ratio = cases[i].hh;
		p.recent_ratio = cases[i].rr;
		sl_err_clear();
		int rc = sl_policy_validate(&p, "rel.json");
		ck_assert_msg(rc == cases[i].code, "case %zu: rc %d (%s), want %d", i, rc, sl_errmsg(),
			      cases[i].code);
		if (cases[i].needle)
			ck_msg_has("rel.json", cases[i].needle, (const char *)NULL);
	}
}
END_TEST

/* ---- loading ---------------------------------------------------------------------- */

START_TEST(load_good)
{
	sl_policy p, want;
	sl_policy_default(&p);
	p.gpu_batch_size = 3;
	p.overlap = false;
	ck_assert_int_eq(load_text("empty_obj.json", "{}", &p), 0);
	sl_policy_default(&want);
	ck_same(&p, &want); /* starts from the defaults, not from *p */

	ck_assert_int_eq(load_text("some.json",
				   "{ \"version\": 1, \"gpu_batch_size\": 52, \"num_gpu_batches\": 8,\n"
				   "  \"w_gpu_percent\": 0, \"w_cpu_percent\": 100,\n"
				   "  \"cache_gpu_percent\": 0, \"cache_cpu_percent\": 100.0,\n"
				   "  \"act_gpu_percent\": 0, \"act_cpu_percent\": 100,\n"
				   "  \"cpu_cache_compute\": true, \"pin_weight\": false,\n"
				   "  \"hh_ratio\": 0.2, \"recent_ratio\": 0.25 }\n",
				   &p),
			 0);
	want.gpu_batch_size = 52;
	want.num_gpu_batches = 8;
	want.w_gpu_percent = 0;
	want.w_cpu_percent = 100;
	want.cache_gpu_percent = 0;
	want.cache_cpu_percent = 100;
	want.act_gpu_percent = 0;
	want.act_cpu_percent = 100;
	want.cpu_cache_compute = true;
	want.pin_weight = false;
	want.hh_ratio = 0.2;
	want.recent_ratio = 0.25;
	ck_same(&p, &want);
}
END_TEST

START_TEST(load_unknown_fields)
{
	BAD_LOAD("unk1.json", "{\"foo_bar_baz\": 1}", SL_EFORMAT, "unknown field 'foo_bar_baz'");
	sl_policy p;
	ck_assert_int_eq(load_text("unk1b.json", "{\"foo_bar_baz\": 1}", &p), SL_EFORMAT);
	ck_assert_msg(!strstr(sl_errmsg(), "did you mean"), "%s", sl_errmsg());
	BAD_LOAD("typo1.json", "{\"gpu_bacth_size\": 8}", SL_EFORMAT, "'gpu_bacth_size'",
		 "did you mean 'gpu_batch_size'");
	BAD_LOAD("typo2.json", "{\"overlapp\": true}", SL_EFORMAT, "did you mean 'overlap'");
	BAD_LOAD("typo3.json", "{\"hh-ratio\": 0.1}", SL_EFORMAT, "did you mean 'hh_ratio'");
	BAD_LOAD("typo4.json", "{\"versoin\": 1}", SL_EFORMAT, "did you mean 'version'");
	BAD_LOAD("typo5.json", "{\"w_gpu_precent\": 50}", SL_EFORMAT, "did you mean 'w_gpu_percent'");
	BAD_LOAD("typo6.json", "{\"cache_cpu_percen\": 5}", SL_EFORMAT, "did you mean 'cache_cpu_percent'");
	BAD_LOAD("typo8.json", "{\"gpu_btch_sze\": 8}", SL_EFORMAT, "did you mean 'gpu_batch_size'");
	BAD_LOAD("typo9.json", "{\"pinweights\": true}", SL_EFORMAT, "did you mean 'pin_weight'");
	ck_assert_int_eq(load_text("typo10.json", "{\"overlapped\": true}", &p), SL_EFORMAT);
	ck_assert_msg(!strstr(sl_errmsg(), "did you mean"), "distance 3 suggested: %s", sl_errmsg());
	BAD_LOAD("typo7.json", "{\"Recent_Ratio\": 0.1}", SL_EFORMAT, "did you mean 'recent_ratio'");
	/* FlexGen's own names that sluice does not have */
	BAD_LOAD("unk2.json", "{\"attn_sparsity\": 1.0}", SL_EFORMAT, "attn_sparsity");
	/* a key with control characters stays on one line */
	BAD_LOAD("unk3.json", "{\"a\\nb\\u0001c\": 1}", SL_EFORMAT, "unknown field 'a?b?c'");
	/* the first bad key in file order is the one reported */
	BAD_LOAD("unk4.json", "{\"gpu_batch_size\": 4, \"zzz_top\": 1, \"aaa\": 2}", SL_EFORMAT, "zzz_top");
}
END_TEST

START_TEST(load_wrong_types)
{
	static const char *const int_bad[] = { "\"8\"", "8.5", "8.0", "true", "null", "[8]", "{}" };
	static const char *const num_bad[] = { "\"50\"", "true", "false", "null", "[1]", "{\"a\":1}" };
	static const char *const bool_bad[] = { "1", "0", "\"true\"", "null", "[]", "0.0" };
	char text[256], name[64];
	for (size_t i = 0; i < NSPEC; i++) {
		const spec_t *s = &spec[i];
		const char *const *bad = s->kind == 'i' ? int_bad : s->kind == 'n' ? num_bad : bool_bad;
		size_t nbad = s->kind == 'i' ? 7 : 6;
		const char *want = s->kind == 'i' ? "must be an integer" :
				   s->kind == 'n' ? "must be a number" : "must be true or false";
		for (size_t k = 0; k < nbad; k++) {
			snprintf(text, sizeof text, "{\"%s\": %s}", s->name, bad[k]);
			snprintf(name, sizeof name, "type_%s_%zu.json", s->name, k);
			BAD_LOAD(name, text, SL_EFORMAT, s->name, want);
		}
	}
	BAD_LOAD("type_version.json", "{\"version\": \"1\"}", SL_EFORMAT, "version must be an integer");
	BAD_LOAD("version2.json", "{\"version\": 2}", SL_EUNSUPPORTED, "version = 2");
	sl_policy p;
	ck_assert_int_eq(load_text("version1.json", "{\"version\": 1}", &p), 0);
	/* percents may be written as integers or reals */
	ck_assert_int_eq(load_text("int_pct.json", "{\"w_gpu_percent\": 40, \"w_cpu_percent\": 60.0}", &p), 0);
	ck_assert(p.w_gpu_percent == 40 && p.w_cpu_percent == 60);
}
END_TEST

/* Every numeric field just outside each bound, through a file; at the bounds it loads. */
START_TEST(load_out_of_range)
{
	char text[256], name[64], v[64], bounds[64];
	for (size_t i = 0; i < NSPEC; i++) {
		const spec_t *s = &spec[i];
		if (s->kind == 'b')
			continue;
		snprintf(bounds, sizeof bounds, "[%g, %g]", s->min, s->max);
		double d[] = { 1, 1e-9, 1000, 1e30 };
		for (int side = 0; side < 2; side++) {
			for (int k = 0; k < 4; k++) {
				if (s->kind == 'i' && (k == 1 || k == 3))
					continue; /* 1e30 is not a JSON integer jansson reads */
				double x = side ? s->max + d[k] : s->min - d[k];
				if (s->kind == 'i')
					snprintf(v, sizeof v, "%.0f", x);
				else
					fmtd(v, x);
				snprintf(text, sizeof text, "{\"%s\": %s}", s->name, v);
				snprintf(name, sizeof name, "range_%s_%d_%d.json", s->name, side, k);
				BAD_LOAD(name, text, SL_ERANGE, s->name, bounds);
			}
		}
	}
	/* huge integers do not wrap into range */
	BAD_LOAD("range_big.json", "{\"gpu_batch_size\": 4294967304}", SL_ERANGE, "4294967304");
	BAD_LOAD("range_big2.json", "{\"num_gpu_batches\": -9223372036854775807}", SL_ERANGE,
		 "num_gpu_batches");

	/* the bounds themselves load, with companions that keep the rules */
	static const char *const ok[] = {
		"{\"gpu_batch_size\": 1, \"num_gpu_batches\": 1}",
		"{\"gpu_batch_size\": 65536, \"num_gpu_batches\": 4096}",
		"{\"w_gpu_percent\": 0, \"w_cpu_percent\": 0}",
		"{\"w_gpu_percent\": 0, \"w_cpu_percent\": 100}",
		"{\"cache_gpu_percent\": 0, \"cache_cpu_percent\": 100}",
		"{\"cache_gpu_percent\": 0, \"cache_cpu_percent\": 0}",
		"{\"act_gpu_percent\": 0, \"act_cpu_percent\": 100}",
		"{\"act_gpu_percent\": 0, \"act_cpu_percent\": 0}",
		"{\"hh_ratio\": 1, \"recent_ratio\": 0}",
		"{\"hh_ratio\": 0, \"recent_ratio\": 0}",
		"{\"hh_ratio\": 0.5, \"recent_ratio\": -1}",
		"{\"hh_ratio\": 1e-300, \"recent_ratio\": 1}",
	};
	for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
		sl_policy p;
		snprintf(name, sizeof name, "bound_ok_%zu.json", k);
		int rc = load_text(name, ok[k], &p);
		ck_assert_msg(rc == 0, "%s: %s", ok[k], sl_errmsg());
	}
}
END_TEST

START_TEST(load_relations)
{
	BAD_LOAD("sum_w.json", "{\"w_gpu_percent\": 90, \"w_cpu_percent\": 40}", SL_ERANGE,
		 "w_gpu_percent + w_cpu_percent = 130, must be at most 100");
	BAD_LOAD("sum_w2.json", "{\"w_cpu_percent\": 30}", SL_ERANGE,
		 "w_gpu_percent + w_cpu_percent = 130"); /* w_gpu defaults to 100 */
	BAD_LOAD("sum_c.json", "{\"cache_gpu_percent\": 50.5, \"cache_cpu_percent\": 50}", SL_ERANGE,
		 "cache_gpu_percent + cache_cpu_percent = 100.5");
	BAD_LOAD("sum_a.json", "{\"act_gpu_percent\": 70, \"act_cpu_percent\": 70}", SL_ERANGE,
		 "act_gpu_percent + act_cpu_percent = 140");
	BAD_LOAD("act_split.json", "{\"act_gpu_percent\": 50, \"act_cpu_percent\": 50}", SL_EUNSUPPORTED,
		 "act_gpu_percent = 50, act_cpu_percent = 50", "one device");
	BAD_LOAD("act_part.json", "{\"act_gpu_percent\": 20}", SL_EUNSUPPORTED, "act_gpu_percent = 20");
	BAD_LOAD("hh1.json", "{\"hh_ratio\": 0.75}", SL_ERANGE, "hh_ratio + recent_ratio",
		 "= 1.5, must be at most 1");
	BAD_LOAD("hh2.json", "{\"hh_ratio\": 0.3, \"recent_ratio\": 0.8}", SL_ERANGE, "= 1.1");
	/* hh_ratio 0 with a recent window: recent-only, valid */
	{
		sl_policy rp;
		char rpath[512];
		snprintf(rpath, sizeof rpath, "%s/hh3.json", tmpdir);
		FILE *rf = fopen(rpath, "w");
		fputs("{\"recent_ratio\": 0.1}", rf);
		fclose(rf);
		ck_assert_int_eq(sl_policy_load(rpath, &rp), 0);
		ck_assert(sl_policy_recent_ratio(&rp) == 0.1);
	}
	/* a near-100 sum from decimal rounding is fine */
	sl_policy p;
	ck_assert_int_eq(load_text("sum_round.json", "{\"w_gpu_percent\": 33.3, \"w_cpu_percent\": 66.7,"
				   " \"cache_gpu_percent\": 0.1, \"cache_cpu_percent\": 99.9}", &p), 0);
}
END_TEST

START_TEST(load_malformed)
{
	BAD_LOAD("syntax3.json", "{\n  \"gpu_batch_size\": 8,\n  oops\n}\n", SL_EFORMAT, "line 3",
		 "not valid JSON");
	BAD_LOAD("syntax1.json", "{\"gpu_batch_size\": 8,}", SL_EFORMAT, "line 1", "not valid JSON");
	BAD_LOAD("syntax5.json", "{\n\n\n\n  \"overlap\": tru\n}", SL_EFORMAT, "line 5");
	BAD_LOAD("unterminated.json", "{\"overlap\": true", SL_EFORMAT, "not valid JSON");
	BAD_LOAD("trailing.json", "{\"overlap\": true} {}", SL_EFORMAT, "not valid JSON");
	BAD_LOAD("empty.json", "", SL_EFORMAT, "not valid JSON");
	BAD_LOAD("comment.json", "// policy\n{}", SL_EFORMAT, "line 1");
	BAD_LOAD("dup.json", "{\"overlap\": true,\n \"overlap\": false}", SL_EFORMAT, "line 2", "duplicate");
	BAD_LOAD("array.json", "[1, 2]", SL_EFORMAT, "JSON object", "not an array");
	BAD_LOAD("number.json", "42", SL_EFORMAT, "JSON object", "not 42");
	BAD_LOAD("string.json", "\"gpu_batch_size\"", SL_EFORMAT, "JSON object", "string");
	BAD_LOAD("null.json", "null", SL_EFORMAT, "JSON object", "null");
	BAD_LOAD("nan.json", "{\"hh_ratio\": NaN}", SL_EFORMAT, "not valid JSON");
	BAD_LOAD("binary.json", "\x7f" "ELF\x01\x02", SL_EFORMAT, "not valid JSON");
	BAD_LOAD("ctrl.json", "{\"overlap\": \"a\nb\"}", SL_EFORMAT, "line 1", "not valid JSON");
}
END_TEST

START_TEST(load_missing_and_odd_files)
{
	char path[512];
	sl_policy p, keep;
	sl_policy_default(&p);
	p.num_gpu_batches = 7;
	keep = p;
	tpath(path, "no_such_policy.json");
	sl_err_clear();
	ck_assert_int_eq(sl_policy_load(path, &p), SL_ENOTFOUND);
	ck_msg_has(path, (const char *)NULL);
	ck_same(&p, &keep);

	tpath(path, "no_such_dir/policy.json");
	ck_assert_int_eq(sl_policy_load(path, &p), SL_ENOTFOUND);
	ck_msg_has(path, (const char *)NULL);

	tpath(path, "a_directory.json");
	ck_assert_int_eq(mkdir(path, 0755), 0);
	sl_err_clear();
	ck_assert_int_eq(sl_policy_load(path, &p), SL_EIO);
	ck_msg_has(path, "directory", (const char *)NULL);
	ck_same(&p, &keep);

	/* more than 1 MiB is not a policy file */
	tpath(path, "huge.json");
	FILE *f = fopen(path, "wb");
	ck_assert(f);
	fputc('{', f);
	for (int i = 0; i < (1 << 20); i++)
		fputc(' ', f);
	fputc('}', f);
	fclose(f);
	ck_assert_int_eq(sl_policy_load(path, &p), SL_EFORMAT);
	ck_msg_has(path, "too large", (const char *)NULL);

	if (geteuid() != 0) { /* root reads anything */
		tpath(path, "unreadable.json");
		write_text(path, "{}");
		chmod(path, 0);
		ck_assert_int_eq(sl_policy_load(path, &p), SL_EIO);
		ck_msg_has(path, (const char *)NULL);
	}
	ck_same(&p, &keep);
}
END_TEST

/* ---- saving -------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static void random_policy(sl_policy *p)
{
	sl_policy_default(p);
	p->gpu_batch_size = 1 + (int)(urand() * 65536);
	p->num_gpu_batches = 1 + (int)(urand() * 4096);
	double *pairs[2][2] = { { &p->w_gpu_percent, &p->w_cpu_percent },
				{ &p->cache_gpu_percent, &p->cache_cpu_percent } };
	for (int i = 0; i < 2; i++) {
		double g = urand() < 0.3 ? (double)(int)(urand() * 101) : urand() * 100;
		double c = (100 - g) * urand();
		if (urand() < 0.2)
			c = 100 - g; /* nothing on disk */
		*pairs[i][0] = g;
		*pairs[i][1] = c;
	}
	int a = (int)(urand() * 3);
	p->act_gpu_percent = a == 0 ? 100 : 0;
	p->act_cpu_percent = a == 1 ? 100 : 0;
	p->overlap = urand() < 0.5;
	p->sep_layer = urand() < 0.5;
	p->pin_weight = urand() < 0.5;
	p->cpu_cache_compute = urand() < 0.5;
	p->compress_weight = urand() < 0.5;
	p->compress_cache = urand() < 0.5;
	if (p->compress_cache) {
		p->cache_gpu_percent = urand() < 0.5 ? 100 : 0;
		p->cache_cpu_percent = p->cache_gpu_percent == 100 ? 0 : urand() < 0.5 ? 100 : 0;
	}
	double h = urand();
	if (h < 0.3) {
		p->hh_ratio = 0;
		p->recent_ratio = urand() < 0.5 ? -1 : 0;
	} else {
		p->hh_ratio = urand() * 0.5;
		p->recent_ratio = urand() < 0.5 ? -1 : (1 - p->hh_ratio) * urand();
	}
}

START_TEST(save_round_trip)
{
	char path[512], tmp[520];
	tpath(path, "rt.json");
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	sl_policy p, q;
	sl_policy_default(&p);
	ck_assert_int_eq(sl_policy_save(path, &p), 0);
	ck_assert(!exists(tmp));
	ck_assert_int_eq(sl_policy_load(path, &q), 0);
	ck_same(&p, &q);

	/* awkward doubles come back bit for bit */
	p.w_gpu_percent = 100.0 / 3;
	p.w_cpu_percent = 100.0 / 7;
	p.cache_gpu_percent = 0.1;
	p.cache_cpu_percent = 1e-7;
	p.hh_ratio = 1.0 / 3;
	p.recent_ratio = 0.1 + 0.2;
	p.overlap = false;
	p.compress_weight = true;
	ck_assert_int_eq(sl_policy_save(path, &p), 0);
	ck_assert(!exists(tmp));
	ck_assert_int_eq(sl_policy_load(path, &q), 0);
	ck_same(&p, &q);

	for (int i = 0; i < 300; i++) {
		random_policy(&p);
		int rc = sl_policy_validate(&p, "random");
		ck_assert_msg(rc == 0, "random policy %d invalid: %s", i, sl_errmsg());
		ck_assert_int_eq(sl_policy_save(path, &p), 0);
		ck_assert(!exists(tmp));
		sl_policy_default(&q);
		ck_assert_int_eq(sl_policy_load(path, &q), 0);
		ck_same(&p, &q);
		/* load -> save writes the same bytes */
		char *a = read_text(path);
		ck_assert_int_eq(sl_policy_save(path, &q), 0);
		char *b = read_text(path);
		ck_assert_str_eq(a, b);
		free(a);
		free(b);
	}
}
END_TEST

START_TEST(save_format)
{
	char path[512];
	tpath(path, "fmt.json");
	sl_policy p;
	sl_policy_default(&p);
	p.hh_ratio = 0.2;
	ck_assert_int_eq(sl_policy_save(path, &p), 0);
	/* plain JSON, read without sluice: every field, and version 1 */
	json_error_t e;
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
	ck_assert_msg(root, "%s", e.text);
	ck_assert(json_is_object(root));
	ck_assert_uint_eq(json_object_size(root), NSPEC + 1);
	ck_assert_int_eq(json_integer_value(json_object_get(root, "version")), 1);
	for (size_t i = 0; i < NSPEC; i++) {
		json_t *v = json_object_get(root, spec[i].name);
		ck_assert_msg(v, "saved file lacks %s", spec[i].name);
		if (spec[i].kind == 'b')
			ck_assert(json_is_boolean(v) && json_is_true(v) == (get(&p, spec[i].name) != 0));
		else if (spec[i].kind == 'i')
			ck_assert(json_is_integer(v) && json_integer_value(v) == get(&p, spec[i].name));
		else
			ck_assert(json_is_number(v) && json_number_value(v) == get(&p, spec[i].name));
	}
	json_decref(root);
	/* pretty: one field per line, short numbers */
	char *s = read_text(path);
	ck_assert_msg(strstr(s, "\n  \"hh_ratio\": 0.2,\n"), "%s", s);
	ck_assert_msg(strstr(s, "\n  \"w_gpu_percent\": 100,\n"), "%s", s);
	ck_assert_msg(strstr(s, "\n  \"overlap\": true,\n"), "%s", s);
	ck_assert(s[strlen(s) - 1] == '\n');
	free(s);
}
END_TEST

START_TEST(save_atomic)
{
	char path[512], tmp[520], victim[512];
	tpath(path, "atomic.json");
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	sl_policy a, b, q;
	sl_policy_default(&a);
	sl_policy_default(&b);
	b.gpu_batch_size = 32;
	b.w_gpu_percent = 25;
	b.w_cpu_percent = 75;

	/* a stale .tmp from an interrupted save is replaced and gone afterwards */
	write_text(tmp, "{\"gpu_batch_");
	ck_assert_int_eq(sl_policy_save(path, &a), 0);
	ck_assert(!exists(tmp));
	ck_assert_int_eq(sl_policy_load(path, &q), 0);
	ck_same(&q, &a);

	/* a symlink planted at .tmp is not written through */
	tpath(victim, "victim.txt");
	write_text(victim, "keep me");
	ck_assert_int_eq(symlink(victim, tmp), 0);
	ck_assert_int_eq(sl_policy_save(path, &b), 0);
	ck_assert(!exists(tmp));
	char *v = read_text(victim);
	ck_assert_str_eq(v, "keep me");
	free(v);
	ck_assert_int_eq(sl_policy_load(path, &q), 0);
	ck_same(&q, &b);

	/* when the .tmp cannot be made, the old file stays whole */
	char *before = read_text(path);
	ck_assert_int_eq(mkdir(tmp, 0755), 0);
	sl_err_clear();
	ck_assert_int_eq(sl_policy_save(path, &a), SL_EIO);
	ck_msg_has(path, (const char *)NULL);
	char *after = read_text(path);
	ck_assert_str_eq(before, after);
	free(after);
	ck_assert_int_eq(rmdir(tmp), 0);

	/* an invalid policy is refused and nothing is written */
	sl_policy bad = a;
	bad.act_gpu_percent = 50;
	bad.act_cpu_percent = 50;
	ck_assert_int_eq(sl_policy_save(path, &bad), SL_EUNSUPPORTED);
	ck_msg_has(path, "act_gpu_percent", (const char *)NULL);
	after = read_text(path);
	ck_assert_str_eq(before, after);
	free(after);
	ck_assert(!exists(tmp));
	char other[512];
	tpath(other, "never_written.json");
	bad = a;
	bad.gpu_batch_size = 0;
	ck_assert_int_eq(sl_policy_save(other, &bad), SL_ERANGE);
	ck_msg_has(other, "gpu_batch_size", (const char *)NULL);
	ck_assert(!exists(other));
	free(before);

	/* a missing directory */
	tpath(other, "no_dir/p.json");
	sl_err_clear();
	ck_assert_int_eq(sl_policy_save(other, &a), SL_EIO);
	ck_msg_has(other, (const char *)NULL);

	/* the target is a directory: the rename fails and no .tmp is left */
	tpath(other, "dir_target.json");
	ck_assert_int_eq(mkdir(other, 0755), 0);
	ck_assert_int_eq(sl_policy_save(other, &a), SL_EIO);
	snprintf(tmp, sizeof tmp, "%s.tmp", other);
	ck_assert(!exists(tmp));
}
END_TEST

/* A reader racing a writer sees the old policy or the new one, never a part. */
START_TEST(save_reader_never_sees_partial)
{
	char path[512];
	tpath(path, "race.json");
	sl_policy a, b, q;
	sl_policy_default(&a);
	sl_policy_default(&b);
	b.gpu_batch_size = 64;
	b.w_gpu_percent = 12.5;
	b.w_cpu_percent = 87.5;
	b.hh_ratio = 0.1;
	ck_assert_int_eq(sl_policy_save(path, &a), 0);
	pid_t pid = fork();
	ck_assert(pid >= 0);
	if (pid == 0) {
		for (int i = 0;; i++)
			if (sl_policy_save(path, i & 1 ? &a : &b))
				_exit(1);
	}
	int loads = 0, saw_a = 0, saw_b = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		sl_policy_default(&q);
		q.num_gpu_batches = 99;
		int rc = sl_policy_load(path, &q);
		if (rc) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			ck_abort_msg("load %d during saves failed: %s", loads, sl_errmsg());
		}
		if (sl_policy_equal(&q, &a))
			saw_a++;
		else if (sl_policy_equal(&q, &b))
			saw_b++;
		else
			ck_abort_msg("load %d read a policy that was never saved", loads);
		loads++;
		clock_gettime(CLOCK_MONOTONIC, &t1);
	} while ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9 < 1.0);
	kill(pid, SIGKILL);
	int status;
	waitpid(pid, &status, 0);
	ck_assert_msg(WIFSIGNALED(status), "the writer failed");
	ck_assert_int_gt(loads, 10);
	(void)saw_a;
	(void)saw_b;
}
END_TEST

/* ---- the command line ------------------------------------------------------------ */

#define SETP(p, ...) sl_policy_set_percent(p, (const char *const[6]){ __VA_ARGS__ })

START_TEST(set_percent)
{
	sl_policy p, keep;
	sl_policy_default(&p);
	ck_assert_int_eq(SETP(&p, "20", "80", "0", "100", "0", "100"), 0);
	ck_assert(p.w_gpu_percent == 20 && p.w_cpu_percent == 80 && p.cache_gpu_percent == 0 &&
		  p.cache_cpu_percent == 100 && p.act_gpu_percent == 0 && p.act_cpu_percent == 100);
	ck_assert_int_eq(SETP(&p, "12.5", "1e1", "0", "0", "100", "0"), 0);
	ck_assert(p.w_gpu_percent == 12.5 && p.w_cpu_percent == 10 && p.cache_gpu_percent == 0 &&
		  p.cache_cpu_percent == 0 && p.act_gpu_percent == 100 && p.act_cpu_percent == 0);
	ck_assert_int_eq(SETP(&p, "0", "0", "0", "0", "0", "0"), 0); /* all on disk */
	ck_assert_int_eq(sl_policy_validate(&p, "x"), 0);
	ck_assert_int_eq(SETP(&p, "100", "0", "100", "0", "100", "0"), 0);

	struct {
		const char *v[6];
		int code;
		const char *n1, *n2;
	} bad[] = {
		{ { "abc", "0", "100", "0", "100", "0" }, SL_EINVAL, "'abc' is not a number", "w_gpu_percent" },
		{ { "100", "", "100", "0", "100", "0" }, SL_EINVAL, "is not a number", "w_cpu_percent" },
		{ { "100", "0", "50%", "0", "100", "0" }, SL_EINVAL, "'50%'", "cache_gpu_percent" },
		{ { "100", "0", "100", "0x", "100", "0" }, SL_EINVAL, "'0x'", "cache_cpu_percent" },
		{ { "100", "0", "100", "0", "101", "0" }, SL_ERANGE, "act_gpu_percent = 101", "[0, 100]" },
		{ { "100", "0", "100", "0", "100", "-1" }, SL_ERANGE, "act_cpu_percent = -1", "[0, 100]" },
		{ { "100.0001", "0", "100", "0", "100", "0" }, SL_ERANGE, "w_gpu_percent = 100.0001", "[0, 100]" },
		{ { "nan", "0", "100", "0", "100", "0" }, SL_ERANGE, "w_gpu_percent", "[0, 100]" },
		{ { "inf", "0", "100", "0", "100", "0" }, SL_ERANGE, "w_gpu_percent", "[0, 100]" },
		{ { "70", "40", "100", "0", "100", "0" }, SL_ERANGE, "w_gpu_percent + w_cpu_percent = 110", "at most 100" },
		{ { "100", "0", "90", "20", "100", "0" }, SL_ERANGE, "cache_gpu_percent + cache_cpu_percent = 110", "at most 100" },
		{ { "100", "0", "100", "0", "50", "50" }, SL_EUNSUPPORTED, "act_gpu_percent = 50", "one device" },
		{ { "100", "0", "100", "0", "100", NULL }, SL_EINVAL, "needs 6 values", "act_cpu_percent" },
		{ { NULL, NULL, NULL, NULL, NULL, NULL }, SL_EINVAL, "needs 6 values", "w_gpu_percent" },
	};
	sl_policy_default(&p);
	p.w_gpu_percent = 30;
	p.w_cpu_percent = 30;
	keep = p;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		sl_err_clear();
		int rc = sl_policy_set_percent(&p, bad[i].v);
		ck_assert_msg(rc == bad[i].code, "case %zu: rc %d (%s)", i, rc, sl_errmsg());
		ck_msg_has("--percent", bad[i].n1, bad[i].n2, (const char *)NULL);
		ck_one_line();
		ck_same(&p, &keep); /* all or nothing */
	}
}
END_TEST

static char *dashed(char buf[64], const char *name, bool prefix)
{
	snprintf(buf, 64, "%s%s", prefix ? "--" : "", name);
	for (char *c = buf; *c; c++)
		if (*c == '_')
			*c = '-';
	return buf;
}

START_TEST(set_every_field)
{
	char flag[64], val[64], bounds[64];
	for (size_t i = 0; i < NSPEC; i++) {
		const spec_t *s = &spec[i];
		sl_policy p;
		sl_policy_default(&p);
		const char *names[3] = { s->name, dashed(flag, s->name, true), NULL };
		char plain_dash[64];
		names[2] = dashed(plain_dash, s->name, false);
		if (s->kind == 'b') {
			static const char *const t[] = { "true", "1", "yes", "on", "TRUE", "On" };
			static const char *const f[] = { "false", "0", "no", "off", "False", "OFF" };
			for (int k = 0; k < 6; k++) {
				for (int n = 0; n < 3; n++) {
					ck_assert_int_eq(sl_policy_set(&p, names[n], t[k]), 0);
					ck_assert(get(&p, s->name) == 1);
					ck_assert_int_eq(sl_policy_set(&p, names[n], f[k]), 0);
					ck_assert(get(&p, s->name) == 0);
				}
			}
			static const char *const bad[] = { "maybe", "2", "", "truee", " true" };
			for (int k = 0; k < 5; k++) {
				sl_policy keep = p;
				sl_err_clear();
				ck_assert_int_eq(sl_policy_set(&p, names[1], bad[k]), SL_EINVAL);
				ck_msg_has(names[1], "true or false", (const char *)NULL);
				ck_same(&p, &keep);
			}
			continue;
		}
		/* at the bounds and inside, in every spelling of the name */
		double good[] = { s->min, s->max, s->kind == 'i' ? floor((s->min + s->max) / 2) : 0.1 };
		for (int k = 0; k < 3; k++) {
			for (int n = 0; n < 3; n++) {
				sl_policy_default(&p);
				if (s->kind == 'i')
					snprintf(val, sizeof val, "%.0f", good[k]);
				else
					fmtd(val, good[k]);
				int rc = sl_policy_set(&p, names[n], val);
				ck_assert_msg(rc == 0, "%s %s: %s", names[n], val, sl_errmsg());
				ck_assert_msg(get(&p, s->name) == good[k], "%s %s", names[n], val);
			}
		}
		/* outside the bounds */
		snprintf(bounds, sizeof bounds, "[%g, %g]", s->min, s->max);
		double d = s->kind == 'i' ? 1 : 0.001;
		double out[] = { s->min - d, s->max + d };
		for (int k = 0; k < 2; k++) {
			sl_policy_default(&p);
			sl_policy keep = p;
			snprintf(val, sizeof val, "%.10g", out[k]);
			sl_err_clear();
			ck_assert_int_eq(sl_policy_set(&p, names[1], val), SL_ERANGE);
			ck_msg_has(names[1], s->name, bounds, (const char *)NULL);
			ck_same(&p, &keep);
		}
		/* not of the type */
		static const char *const bad_int[] = { "abc", "8.5", "", "8x", "0x10", "1e3" };
		static const char *const bad_num[] = { "abc", "", "1..2", "0.5.", "--1" };
		const char *const *bad = s->kind == 'i' ? bad_int : bad_num;
		int nbad = s->kind == 'i' ? 6 : 5;
		for (int k = 0; k < nbad; k++) {
			sl_policy keep = p;
			sl_err_clear();
			int rc = sl_policy_set(&p, names[0], bad[k]);
			ck_assert_msg(rc == SL_EINVAL, "%s '%s': rc %d", names[0], bad[k], rc);
			ck_msg_has(names[0], s->kind == 'i' ? "not an integer" : "not a number",
				   (const char *)NULL);
			ck_same(&p, &keep);
		}
		if (s->kind == 'n') {
			static const char *const nonfinite[] = { "nan", "inf", "-inf", "1e999" };
			for (int k = 0; k < 4; k++) {
				ck_assert_int_eq(sl_policy_set(&p, names[0], nonfinite[k]), SL_ERANGE);
				ck_msg_has(names[0], bounds, (const char *)NULL);
			}
		} else {
			ck_assert_int_eq(sl_policy_set(&p, names[0], "99999999999999999999999"), SL_ERANGE);
			ck_assert_int_eq(sl_policy_set(&p, names[0], "-4294967295"), SL_ERANGE);
		}
	}
}
END_TEST

START_TEST(set_names)
{
	sl_policy p, keep;
	sl_policy_default(&p);
	keep = p;
	ck_assert_int_eq(sl_policy_set(&p, "--gpu-bach-size", "8"), SL_EINVAL);
	ck_msg_has("--gpu-bach-size", "did you mean '--gpu-batch-size'", (const char *)NULL);
	ck_assert_int_eq(sl_policy_set(&p, "gpu_bach_size", "8"), SL_EINVAL);
	ck_msg_has("gpu_bach_size", "did you mean 'gpu_batch_size'", (const char *)NULL);
	ck_assert_int_eq(sl_policy_set(&p, "--hh-ration", "0.1"), SL_EINVAL);
	ck_msg_has("did you mean '--hh-ratio'", (const char *)NULL);
	ck_assert_int_eq(sl_policy_set(&p, "model", "x"), SL_EINVAL);
	ck_msg_has("model", "unknown", (const char *)NULL);
	ck_assert(!strstr(sl_errmsg(), "did you mean"));
	ck_assert_int_eq(sl_policy_set(&p, "version", "1"), SL_EINVAL); /* a file thing only */
	ck_assert_int_eq(sl_policy_set(&p, "", "1"), SL_EINVAL);
	ck_assert_int_eq(sl_policy_set(&p, "--", "1"), SL_EINVAL);
	char longname[300];
	memset(longname, 'x', sizeof longname - 1);
	longname[sizeof longname - 1] = 0;
	ck_assert_int_eq(sl_policy_set(&p, longname, "1"), SL_EINVAL);
	ck_one_line();
	ck_assert_int_eq(sl_policy_set(&p, "--overlap", NULL), SL_EINVAL);
	ck_msg_has("--overlap", (const char *)NULL);
	ck_same(&p, &keep);
	/* set checks its own field only; the rules wait for validate */
	ck_assert_int_eq(sl_policy_set(&p, "--w-cpu-percent", "50"), 0);
	ck_assert_int_eq(sl_policy_validate(&p, "flags"), SL_ERANGE);
	ck_assert_int_eq(sl_policy_set(&p, "--w-gpu-percent", "50"), 0);
	ck_assert_int_eq(sl_policy_validate(&p, "flags"), 0);
}
END_TEST

/* ---- print, usage, docs -------------------------------------------------------- */

__attribute__((noinline)) static char *capture(void (*fn)(FILE *, const void *), const void *arg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	ck_assert(f);
	fn(f, arg);
	fclose(f);
	return buf;
}

static void do_print(FILE *f, const void *p)
{
	sl_policy_print(p, f);
}
static void do_usage(FILE *f, const void *p)
{
	(void)p;
	sl_policy_usage(f);
}
static void do_doc(FILE *f, const void *p)
{
	(void)p;
	sl_policy_doc_markdown(f);
}

START_TEST(print_and_usage)
{
	sl_policy p;
	sl_policy_default(&p);
	p.w_gpu_percent = 20;
	p.w_cpu_percent = 50;
	p.hh_ratio = 0.1;
	char *s = capture(do_print, &p);
	for (size_t i = 0; i < NSPEC; i++)
		ck_assert_msg(strstr(s, spec[i].name), "print lacks %s:\n%s", spec[i].name, s);
	ck_assert_msg(strstr(s, "8 sequences"), "%s", s);
	ck_assert_msg(strstr(s, "weights 30%"), "%s", s);
	ck_assert_msg(strstr(s, "heavy 0.1 + recent 0.1"), "%s", s);
	free(s);

	s = capture(do_usage, NULL);
	char flag[64];
	for (size_t i = 0; i < NSPEC; i++)
		ck_assert_msg(strstr(s, dashed(flag, spec[i].name, true)), "usage lacks %s", flag);
	ck_assert(strstr(s, "--gpu-batch-size N"));
	ck_assert(strstr(s, "--percent WG WC CG CC AG AC"));
	free(s);
}
END_TEST

/* "predicted" (what sluice policy predicted): an object is accepted and
 * ignored; anything else is a one-line error naming the file and the field;
 * sl_policy_save_predicted writes it after the fields, atomically. */
START_TEST(load_predicted)
{
	sl_policy p, want;
	sl_policy_default(&want);
	want.gpu_batch_size = 4;
	want.w_gpu_percent = 50;
	sl_policy_default(&p);
	ck_assert_int_eq(load_text("pred.json",
				   "{\"gpu_batch_size\": 4, \"predicted\": {\"throughput_tok_s\": 12.5,"
				   " \"peak_bytes\": {\"device\": 1}, \"x\": [1, null]},"
				   " \"w_gpu_percent\": 50}",
				   &p),
			 0);
	ck_same(&p, &want);
	sl_policy_default(&p);
	ck_assert_int_eq(load_text("pred_empty.json", "{\"predicted\": {}}", &p), 0);
	sl_policy def;
	sl_policy_default(&def);
	ck_same(&p, &def);
	BAD_LOAD("pred_num.json", "{\"predicted\": 3}", SL_EFORMAT, "predicted must be an object",
		 "got");
	BAD_LOAD("pred_arr.json", "{\"predicted\": [1]}", SL_EFORMAT, "predicted must be an object");
	BAD_LOAD("pred_null.json", "{\"predicted\": null}", SL_EFORMAT, "predicted must be an object");
	BAD_LOAD("pred_str.json", "{\"predicted\": \"fast\"}", SL_EFORMAT,
		 "predicted must be an object");
	BAD_LOAD("pred_twice.json", "{\"predicted\": {}, \"predicted\": {}}", SL_EFORMAT,
		 "predicted");

	/* written after the fields, read back as the same policy */
	char path[512], tmp[520];
	tpath(path, "pred_save.json");
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	ck_assert_int_eq(sl_policy_save_predicted(path, &want,
						  "{\"throughput_tok_s\": 99.5, \"prefill_bottleneck\": \"compute\"}"),
			 0);
	ck_assert(!exists(tmp));
	json_t *root = json_load_file(path, 0, NULL);
	ck_assert(root);
	json_t *pr = json_object_get(root, "predicted");
	ck_assert(json_is_object(pr));
	ck_assert(json_real_value(json_object_get(pr, "throughput_tok_s")) == 99.5);
	ck_assert_str_eq(json_string_value(json_object_get(pr, "prefill_bottleneck")), "compute");
	ck_assert_int_eq(json_integer_value(json_object_get(root, "gpu_batch_size")), 4);
	json_decref(root);
	ck_assert_int_eq(sl_policy_load(path, &p), 0);
	ck_same(&p, &want);
	/* not an object: refused, nothing written */
	tpath(path, "pred_bad_save.json");
	ck_assert_int_eq(sl_policy_save_predicted(path, &want, "[1, 2]"), SL_EINVAL);
	ck_one_line();
	ck_assert(!exists(path));
	ck_assert_int_eq(sl_policy_save_predicted(path, &want, "{\"a\": "), SL_EINVAL);
	ck_assert(!exists(path));
	/* NULL: as sl_policy_save */
	ck_assert_int_eq(sl_policy_save_predicted(path, &want, NULL), 0);
	root = json_load_file(path, 0, NULL);
	ck_assert(root && !json_object_get(root, "predicted"));
	json_decref(root);
}
END_TEST

START_TEST(doc_markdown)
{
	char *s = capture(do_doc, NULL);
	ck_assert(strstr(s, "| field | default | bounds | meaning |\n|---|---|---|---|\n"));
	char row[256];
	for (size_t i = 0; i < NSPEC; i++) {
		const spec_t *sp = &spec[i];
		if (sp->kind == 'b')
			snprintf(row, sizeof row, "| `%s` | `%s` | `true` or `false` | ", sp->name,
				 sp->def ? "true" : "false");
		else
			snprintf(row, sizeof row, "| `%s` | `%g` | %s in [%g, %g] | ", sp->name, sp->def,
				 sp->kind == 'i' ? "integer" : "number", sp->min, sp->max);
		ck_assert_msg(strstr(s, row), "doc lacks the row '%s'", row);
	}
	/* every ```json example in the doc is a valid policy file */
	int examples = 0;
	for (char *b = strstr(s, "```json\n"); b; b = strstr(b, "```json\n")) {
		b += 8;
		char *e = strstr(b, "```");
		ck_assert(e);
		char name[64], path[512];
		snprintf(name, sizeof name, "doc_example_%d.json", examples++);
		*e = 0;
		write_text(tpath(path, name), b);
		*e = '`';
		sl_policy p;
		int rc = sl_policy_load(path, &p);
		ck_assert_msg(rc == 0, "doc example %d: %s", examples, sl_errmsg());
	}
	ck_assert_int_ge(examples, 2);
	/* the prediction's members are documented */
	static const char *const pred[] = { "`\"predicted\"`", "`throughput_tok_s`", "`prefill_s`",
					    "`decode_s`", "`prefill_bottleneck`",
					    "`decode_bottleneck`", "`peak_bytes`", "`profile`" };
	for (size_t i = 0; i < SL_ARRAY_LEN(pred); i++)
		ck_assert_msg(strstr(s, pred[i]), "doc lacks %s", pred[i]);
	if (doc_path) {
		char *file = read_text(doc_path);
		ck_assert_msg(file, "cannot read %s", doc_path);
		ck_assert_msg(!strcmp(file, s),
			      "%s is out of date: regenerate it with policy_doc %s", doc_path, doc_path);
		free(file);
	}
	free(s);
}
END_TEST

/* ---- main ------------------------------------------------------------------------ */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	chmod(path, 0700);
	return remove(path);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		doc_path = argv[1];
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/sl_policy_XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	Suite *s = suite_create("policy");
	TCase *tc = tcase_create("policy");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, defaults);
	tcase_add_test(tc, validate_bounds);
	tcase_add_test(tc, validate_relations);
	tcase_add_test(tc, load_good);
	tcase_add_test(tc, load_unknown_fields);
	tcase_add_test(tc, load_wrong_types);
	tcase_add_test(tc, load_out_of_range);
	tcase_add_test(tc, load_relations);
	tcase_add_test(tc, load_malformed);
	tcase_add_test(tc, load_missing_and_odd_files);
	tcase_add_test(tc, save_round_trip);
	tcase_add_test(tc, save_format);
	tcase_add_test(tc, save_atomic);
	tcase_add_test(tc, save_reader_never_sees_partial);
	tcase_add_test(tc, set_percent);
	tcase_add_test(tc, set_every_field);
	tcase_add_test(tc, set_names);
	tcase_add_test(tc, print_and_usage);
	tcase_add_test(tc, load_predicted);
	tcase_add_test(tc, doc_markdown);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return failed ? 1 : 0;
}
