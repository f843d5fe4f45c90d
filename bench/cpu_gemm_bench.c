/*
 * cpu_gemm_bench.c - the CPU backend's GEMM op against OpenBLAS's sgemm at
 * OPT prefill shapes, measured in the same process, interleaved:
 *   - sluice: the gemm op (fp16 weights, bias) through the backend table,
 *     as the engine calls it: one summation order for every row count;
 *   - blas: cblas_sgemm on the same product with the weights already fp32
 *     (the ceiling of a BLAS path: no widening, no epilogue), one call;
 *   - blas-tiled: the same, called on fixed tiles of --tile rows (the tail
 *     padded into a full tile), the cheapest way to make OpenBLAS's result
 *     for a row independent of the row count (every call one shape);
 *   - q4 (--q4): the gemm op with the same weights quantised to 4 bits
 *     (common/sl_q4.h, issue 14), dequantised inside the kernel, against
 *     the fp16 op in the q4/fp16 column (decode-sized m is where the 3.6x
 *     fewer weight bytes can pay; the dequantisation is the price).
 * OpenBLAS is loaded at run time (dlopen), so sluice does not link it; its
 * kernels follow OPENBLAS_CORETYPE as usual, and the core that ran is
 * reported.  Without libopenblas only the sluice rows are measured.
 *
 * Usage: cpu_gemm_bench [--json] [--threads N] [--reps R] [--tile T] [--no-blas]
 *                       [--q4] [--rows M,M,...] [--models opt-125m,opt-1.3b]
 * Times are wall clock; the table gives the median of R runs per cell, in
 * GFLOP/s (2 m n k per product).  --json prints one JSON object on stdout,
 * with every timing of each cell (as GFLOP/s) beside the medians.
 */
#include "backend.h"
#include "cpu/cpu_backend.h"
#include "sl_json.h"
#include "sl_q4.h"


#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
			 const float *a, int lda, const float *b, int ldb, float beta, float *c,
			 int ldc);

static struct {
	sgemm_fn sgemm;
	void (*set_threads)(int);
	char *(*corename)(void);
	char *(*config)(void);
} g_blas;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bool load_blas(void)
{
	void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return false;
	g_blas.sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
	g_blas.set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
	g_blas.corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
	g_blas.config = (char *(*)(void))dlsym(h, "openblas_get_config");
	return g_blas.sgemm != NULL;
}

/* The fixed-tile call: rows [0, m) in tiles of t rows, the last one padded
 * through xt/yt (t rows each). */
static void blas_tiled(int m, int n, int k, const float *x, const float *w, float *y, int t,
		       float *xt, float *yt)
{
	int r0 = 0;
	for (; r0 + t <= m; r0 += t)
		g_blas.sgemm(ROW_MAJOR, NO_TRANS, TRANS, t, n, k, 1.0f, x + (size_t)r0 * k, k, w, k,
			     0.0f, y + (size_t)r0 * n, n);
	if (r0 < m) {
		memcpy(xt, x + (size_t)r0 * k, (size_t)(m - r0) * k * sizeof(float));
		g_blas.sgemm(ROW_MAJOR, NO_TRANS, TRANS, t, n, k, 1.0f, xt, k, w, k, 0.0f, yt, n);
		memcpy(y + (size_t)r0 * n, yt, (size_t)(m - r0) * n * sizeof(float));
	}
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v <= 0 || v > 1 << 20)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	bool json = false, no_blas = false, q4 = false;
	int nt = 0, reps = 5, tile = 128, rows[32], nrows = 0;
	const char *models = "opt-125m,opt-1.3b";
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(o, "--json")) {
			json = true;
		} else if (!strcmp(o, "--no-blas")) {
			no_blas = true;
		} else if (!strcmp(o, "--q4")) {
			q4 = true;
		} else if (v && !strcmp(o, "--threads")) {
			nt = atoi(v), i++;
		} else if (v && !strcmp(o, "--reps")) {
			reps = atoi(v), i++;
		} else if (v && !strcmp(o, "--tile")) {
			tile = atoi(v), i++;
		} else if (v && !strcmp(o, "--rows")) {
			if ((nrows = parse_list(v, rows, 32)) <= 0) {
				fprintf(stderr, "cpu_gemm_bench: --rows: a list of positive counts\n");
				return 2;
			}
			i++;
		} else if (v && !strcmp(o, "--models")) {
			models = v, i++;
		} else {
			fprintf(stderr, "cpu_gemm_bench: unknown option %s (see the file's header)\n", o);
			return 2;
		}
	}
	if (reps < 1 || reps > 1000 || tile < 1 || nt < 0) {
		fprintf(stderr, "cpu_gemm_bench: --reps 1..1000, --tile and --threads positive\n");
		return 2;
	}
	if (!nrows) {
		const int def[] = { 128, 256, 512, 1024, 2048, 4096 };
		nrows = (int)(sizeof def / sizeof *def);
		memcpy(rows, def, sizeof def);
	}
	sl_backend *b;
	if (sl_backend_create("cpu", nt, &b) < 0) {
		fprintf(stderr, "cpu_gemm_bench: %s\n", sl_errmsg());
		return 1;
	}
	if (!nt) /* as the CPU backend counts them */
		nt = (int)SL_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
	const char *kernels = sl_cpu_backend_kernels(b);
	const bool have_blas = !no_blas && load_blas();
	if (have_blas && g_blas.set_threads)
		g_blas.set_threads(nt);
	const char *core = have_blas && g_blas.corename ? g_blas.corename() : NULL;
	FILE *txt = json ? stderr : stdout;
	fprintf(txt, "sluice kernels: %s, %d threads; OpenBLAS: %s%s%s\n", kernels, nt,
		have_blas ? (core ? core : "?") : "not found",
		have_blas && g_blas.config ? ", " : "", have_blas && g_blas.config ? g_blas.config() : "");
	fprintf(txt, "%-9s %6s %6s %6s %10s %10s %10s %8s", "model", "m", "n", "k",
		"sluice", "blas", "blas-tile", "s/blas");
	if (q4)
		fprintf(txt, " %10s %8s", "q4", "q4/fp16");
	fprintf(txt, "\n");

	struct { const char *name; int h, f; } cfgs[] = { { "opt-125m", 768, 3072 },
							  { "opt-1.3b", 2048, 8192 } };
	sl_jerr je = { 0 };
	json_t *jout = json_object(), *jrows = json_array();
	int rc = 0;
	for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
		if (!strstr(models, cfgs[ci].name))
			continue;
		const int h = cfgs[ci].h, f = cfgs[ci].f;
		const int shapes[3][2] = { { h, h }, { f, h }, { h, f } }; /* (n, k): qkvo, fc1, fc2 */
		for (int si = 0; si < 3; si++) {
			const int n = shapes[si][0], k = shapes[si][1];
			for (int ri = 0; ri < nrows; ri++) {
				const int m = rows[ri], mt = SL_MAX(m, tile);
				float *x = malloc((size_t)mt * k * sizeof(float));
				float *y = malloc((size_t)mt * n * sizeof(float));
				float *wf = malloc((size_t)n * k * sizeof(float));
				float *xt = malloc((size_t)tile * k * sizeof(float));
				float *yt = malloc((size_t)tile * n * sizeof(float));
				sl_half *w = malloc((size_t)n * k * sizeof(sl_half));
				sl_half *bias = malloc((size_t)n * sizeof(sl_half));
				double *ts = malloc((size_t)reps * 4 * sizeof(double));
				void *wq = q4 ? malloc(sl_q4_bytes((size_t)n, (size_t)k)) : NULL;
				if (!x || !y || !wf || !xt || !yt || !w || !bias || !ts || (q4 && !wq)) {
					fprintf(stderr, "cpu_gemm_bench: out of memory\n");
					return 1;
				}
				for (size_t i = 0; i < (size_t)m * k; i++)
					x[i] = (float)((i * 2654435761u >> 16) % 1000) / 1000.0f - 0.5f;
				for (size_t i = 0; i < (size_t)n * k; i++) {
					w[i] = sl_float_to_half((float)((i * 40503u >> 8) % 200) / 4000.0f -
								0.025f);
					wf[i] = sl_half_to_float(w[i]);
				}
				for (int i = 0; i < n; i++)
					bias[i] = sl_float_to_half(0.01f * (float)(i % 7));
				memset(xt, 0, (size_t)tile * k * sizeof(float));
				const sl_gemm_args a = { .m = m, .n = n, .k = k, .x = x, .ldx = k, .w = w,
							 .bias = bias, .y = y, .ldy = n };
				sl_gemm_args aq = a;
				if (q4) {
					sl_q4_quantize_matrix(w, (size_t)n, (size_t)k, wq);
					aq.w = NULL;
					aq.wq = wq;
				}
				/* warm-up: workspaces, pages, OpenBLAS's buffers */
				if (sl_gemm(b, NULL, &a) < 0 || (q4 && sl_gemm(b, NULL, &aq) < 0)) {
					fprintf(stderr, "cpu_gemm_bench: %s\n", sl_errmsg());
					return 1;
				}
				if (have_blas) {
					g_blas.sgemm(ROW_MAJOR, NO_TRANS, TRANS, m, n, k, 1.0f, x, k, wf, k,
						     0.0f, y, n);
					blas_tiled(m, n, k, x, wf, y, tile, xt, yt);
				}
				for (int r = 0; r < reps; r++) {
					double t0 = now();
					if (sl_gemm(b, NULL, &a) < 0) {
						fprintf(stderr, "cpu_gemm_bench: %s\n", sl_errmsg());
						return 1;
					}
					ts[r] = now() - t0;
					if (q4) {
						t0 = now();
						if (sl_gemm(b, NULL, &aq) < 0) {
							fprintf(stderr, "cpu_gemm_bench: %s\n", sl_errmsg());
							return 1;
						}
						ts[3 * reps + r] = now() - t0;
					}
					if (!have_blas)
						continue;
					t0 = now();
					g_blas.sgemm(ROW_MAJOR, NO_TRANS, TRANS, m, n, k, 1.0f, x, k, wf, k,
						     0.0f, y, n);
					ts[reps + r] = now() - t0;
					t0 = now();
					blas_tiled(m, n, k, x, wf, y, tile, xt, yt);
					ts[2 * reps + r] = now() - t0;
				}
				const double flop = 2.0 * m * (double)n * k;
				/* every timing as GFLOP/s (before median() sorts them) */
				json_t *runs[4] = { json_array(), json_array(), json_array(), json_array() };
				for (int v = 0; v < 4; v++) {
					if ((v == 1 || v == 2) && !have_blas)
						continue;
					if (v == 3 && !q4)
						continue;
					for (int r = 0; r < reps; r++)
						sl_jappend_real(runs[v], flop / ts[v * reps + r] / 1e9, "runs", &je);
				}
				const double gs = flop / median(ts, reps) / 1e9;
				const double gb = have_blas ? flop / median(ts + reps, reps) / 1e9 : 0;
				const double gt = have_blas ? flop / median(ts + 2 * reps, reps) / 1e9 : 0;
				const double gq = q4 ? flop / median(ts + 3 * reps, reps) / 1e9 : 0;
				fprintf(txt, "%-9s %6d %6d %6d %10.1f %10.1f %10.1f %8.2f", cfgs[ci].name,
					m, n, k, gs, gb, gt, have_blas ? gs / gb : 0.0);
				if (q4)
					fprintf(txt, " %10.1f %8.2f", gq, gq / gs);
				fprintf(txt, "\n");
				fflush(txt);
				json_t *jr = json_object();
				sl_jset(jr, "model", json_string(cfgs[ci].name), &je);
				sl_jset(jr, "m", json_integer(m), &je);
				sl_jset(jr, "n", json_integer(n), &je);
				sl_jset(jr, "k", json_integer(k), &je);
				sl_jset_real(jr, "sluice_gflops", gs, &je);
				sl_jset(jr, "blas_gflops", have_blas ? json_real(gb) : json_null(), &je);
				sl_jset(jr, "blas_tiled_gflops", have_blas ? json_real(gt) : json_null(),
					&je);
				sl_jset(jr, "sluice_runs", runs[0], &je);
				sl_jset(jr, "blas_runs", runs[1], &je);
				sl_jset(jr, "blas_tiled_runs", runs[2], &je);
				if (q4) {
					sl_jset_real(jr, "q4_gflops", gq, &je);
					sl_jset(jr, "q4_runs", runs[3], &je);
				} else {
					json_decref(runs[3]);
				}
				sl_jappend(jrows, jr, "rows", &je);
				free(x), free(y), free(wf), free(xt), free(yt), free(w), free(bias),
					free(ts), free(wq);
			}
		}
	}
	sl_jset(jout, "cpu_kernels", json_string(kernels), &je);
	sl_jset(jout, "threads", json_integer(nt), &je);
	sl_jset(jout, "reps", json_integer(reps), &je);
	sl_jset(jout, "tile", json_integer(tile), &je);
	sl_jset(jout, "blas_core", core ? json_string(core) : json_null(), &je);
	sl_jset(jout, "blas_config",
		have_blas && g_blas.config ? json_string(g_blas.config()) : json_null(), &je);
	const char *ct = getenv("OPENBLAS_CORETYPE");
	sl_jset(jout, "openblas_coretype", ct ? json_string(ct) : json_null(), &je);
	sl_jset(jout, "rows", jrows, &je);
	if (sl_jcheck(&je, "cpu_gemm_bench --json") < 0 ||
	    (json && sl_jwrite_line(jout, stdout, "cpu_gemm_bench: standard output") < 0)) {
		fprintf(stderr, "cpu_gemm_bench: %s\n", sl_errmsg());
		rc = 1;
	}
	json_decref(jout);
	sl_backend_free(b);
	return rc;
}
