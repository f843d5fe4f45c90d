/*
 * sampling.c - greedy, temperature, top-k and top-p token choice.
 *
 * Only the candidates that can matter are sorted: top-k's threshold comes
 * from a selection, and top-p first gathers the tokens above a probability
 * threshold, which holds the whole nucleus as soon as their mass reaches
 * top_p (every token left out is less probable than every one kept).
 */
#include "sampling.h"
#include "sl_common.h"
#include "sl_hash.h"

#include <math.h>
#include <string.h>

int sl_sample_ws_init(sl_sample_ws *ws, int n)
{
	ws->p = malloc(sizeof(float) * (size_t)n);
	ws->idx = malloc(sizeof(int32_t) * (size_t)n);
	ws->n = n;
	if (!ws->p || !ws->idx) {
		sl_sample_ws_free(ws);
		return sl_err(SL_ENOMEM, "out of memory");
	}
	return 0;
}

void sl_sample_ws_free(sl_sample_ws *ws)
{
	free(ws->p);
	free(ws->idx);
	ws->p = NULL;
	ws->idx = NULL;
}

double sl_sample_uniform(uint64_t seed, uint64_t key, uint64_t step)
{
	uint64_t r = sl_splitmix64(sl_splitmix64(sl_splitmix64(seed) ^ key) ^ step);
	return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

static int32_t argmax(const float *x, int n)
{
	int32_t best = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
			best = i;
	return best;
}

/* k-th largest of v[0..n) (1-based k), by quickselect on a scratch copy. */
static float kth_largest(float *v, int n, int k)
{
	int lo = 0, hi = n - 1, want = k - 1;
	while (lo < hi) {
		float pivot = v[(lo + hi) / 2];
		int i = lo, j = hi;
		while (i <= j) {
			while (v[i] > pivot)
				i++;
			while (v[j] < pivot)
				j--;
			if (i <= j) {
				float t = v[i];
				v[i] = v[j];
				v[j] = t;
				i++;
				j--;
			}
		}
		if (want <= j)
			hi = j;
		else if (want >= i)
			lo = i;
		else
			break;
	}
	return v[want];
}

/* Sort candidate indices by probability, descending, then index. */
static int by_prob(const void *a, const void *b, void *ctx)
{
	const float *p = ctx;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	if (p[x] != p[y])
		return p[x] > p[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

int32_t sl_sample(const float *logits, int n, const sl_sampling *sp, uint64_t key, uint64_t step,
		  sl_sample_ws *ws)
{
	if (n <= 0)
		return -1;
	for (int i = 0; i < n; i++)
		if (!isfinite(logits[i]))
			return -1; /* no distribution: the caller fails the job */
	const float inv_t = 1.0f / sp->temperature;
	/* greedy, or a temperature so low that the scaled logits overflow:
	 * its limit is the greedy choice */
	if (sp->temperature <= 0.0f || !isfinite(inv_t))
		return argmax(logits, n);
	SL_ASSERT(ws->n >= n);
	float *p = ws->p;
	int32_t *idx = ws->idx;
	/* top-k threshold on the scaled logits */
	float kth = -INFINITY;
	if (sp->top_k > 0 && sp->top_k < n) {
		for (int i = 0; i < n; i++)
			p[i] = logits[i] * inv_t;
		kth = kth_largest(p, n, sp->top_k);
	}
	/* softmax over the tokens top-k keeps */
	float mx = -INFINITY;
	for (int i = 0; i < n; i++) {
		float v = logits[i] * inv_t;
		if (v >= kth && v > mx)
			mx = v;
	}
	if (!isfinite(mx)) /* overflow: as above */
		return argmax(logits, n);
	double total = 0;
	for (int i = 0; i < n; i++) {
		float v = logits[i] * inv_t;
		p[i] = v >= kth ? expf(v - mx) : 0.0f;
		total += p[i];
	}
	const double top_p = (sp->top_p > 0.0f && sp->top_p < 1.0f) ? sp->top_p : 1.0;
	/* gather candidates above a threshold until they hold the nucleus */
	int m = 0;
	double mass = 0;
	for (double thr = exp(-12.0); ; thr *= exp(-12.0)) {
		m = 0;
		mass = 0;
		for (int i = 0; i < n; i++)
			if (p[i] > 0.0f && p[i] >= thr) {
				idx[m++] = i;
				mass += p[i];
			}
		if (mass >= top_p * total || thr < 1e-300)
			break;
	}
	if (top_p >= 1.0) {
		/* no nucleus: every kept token, by index (no sort needed) */
		m = 0;
		mass = 0;
		for (int i = 0; i < n; i++)
			if (p[i] > 0.0f) {
				idx[m++] = i;
				mass += p[i];
			}
	} else {
		qsort_r(idx, (size_t)m, sizeof *idx, by_prob, p);
		double cum = 0;
		int keep = 0;
		while (keep < m) {
			cum += p[idx[keep++]];
			if (cum >= top_p * total)
				break;
		}
		m = keep;
		mass = cum;
	}
	const double u = sl_sample_uniform(sp->seed, key, step) * mass;
	double cum = 0;
	for (int j = 0; j < m; j++) {
		cum += p[idx[j]];
		if (u < cum)
			return idx[j];
	}
	/* m >= 1: the maximum's p is expf(0) = 1 and passes every threshold */
	return m > 0 ? idx[m - 1] : argmax(logits, n);
}
