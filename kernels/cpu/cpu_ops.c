/*
 * cpu_ops.c - layernorm, embedding, attention (prefill and decode over the
 * KV cache: fp16, fp32 or 4-bit sl_q4 slots, with optional H2O score
 * accumulation) and argmax on the CPU.
 * Threads split work over rows or over (sequence, KV head) pairs.  The cache
 * is token-major (backend.h): a (sequence, KV head)'s slots are nkv * hd
 * apart.  Under grouped-query attention a task loads its KV head's keys and
 * values once and runs the group's query heads over them one after the
 * other, so the group's probabilities are added into the one score row
 * by one thread, in a fixed order (head, then query).
 */
#include "cpu_internal.h"

#include <math.h>
#include <omp.h>
#include <string.h>

int sl_cpu_layernorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		     const sl_half *gamma, const sl_half *beta, float eps, float *y, int ldy)
{
	const int nt = sl_cpu(b)->nthreads;
#pragma omp parallel for num_threads(nt) schedule(static)
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * ldx;
		float *yr = y + (size_t)r * ldy;
		double sum = 0.0;
		for (int i = 0; i < n; i++)
			sum += xr[i];
		const double mean = sum / n;
		double var = 0.0;
		for (int i = 0; i < n; i++) {
			double d = xr[i] - mean;
			var += d * d;
		}
		var /= n;
		const float rstd = (float)(1.0 / sqrt(var + (double)eps));
		const float mf = (float)mean;
		for (int i = 0; i < n; i++)
			yr[i] = (xr[i] - mf) * rstd * sl_half_to_float(gamma[i]) +
				sl_half_to_float(beta[i]);
	}
	return 0;
}

int sl_cpu_embed(sl_backend *b, sl_queue *q, int rows, int n, const sl_half *table,
		 const int32_t *idx, float *y, bool accumulate)
{
	sl_cpu_ctx *c = sl_cpu(b);
#pragma omp parallel for num_threads(c->nthreads) schedule(static)
	for (int r = 0; r < rows; r++) {
		const sl_half *src = table + (size_t)idx[r] * n;
		float *dst = y + (size_t)r * n;
		if (accumulate) {
			for (int i = 0; i < n; i++)
				dst[i] += sl_half_to_float(src[i]);
		} else {
			sl_cpu_half_to_float(src, dst, (size_t)n, c->simd);
		}
	}
	return 0;
}

static inline float dot(const float *a, const float *b, int n)
{
	float s = 0.0f;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/*
 * Attention of one query over nk fp32 keys/values (rows of hd): out =
 * softmax(q k^T) v; adds the probabilities into score when given.
 * p is scratch of nk floats.
 */
static void attend_one(const float *qv, const float *kf, const float *vf, int nk, int hd,
		       float *p, float *out, float *score)
{
	float mx = -INFINITY;
	for (int j = 0; j < nk; j++) {
		p[j] = dot(qv, kf + (size_t)j * hd, hd);
		if (p[j] > mx)
			mx = p[j];
	}
	float sum = 0.0f;
	for (int j = 0; j < nk; j++) {
		p[j] = expf(p[j] - mx);
		sum += p[j];
	}
	const float inv = 1.0f / sum;
	for (int d = 0; d < hd; d++)
		out[d] = 0.0f;
	for (int j = 0; j < nk; j++) {
		const float pj = p[j] * inv;
		const float *vr = vf + (size_t)j * hd;
		for (int d = 0; d < hd; d++)
			out[d] += pj * vr[d];
		if (score)
			score[j] += pj;
	}
}

static int attn_workspace(sl_backend *b, int rows, int hd)
{
	sl_cpu_ctx *c = sl_cpu(b);
	size_t per = (size_t)rows * (2 * (size_t)hd + 1) + 64;
	if (per <= c->attn_ws_per_thread)
		return 0;
	size_t cap = 0;
	free(c->attn_ws);
	c->attn_ws = NULL;
	c->attn_ws_per_thread = 0;
	SL_TRY(sl_cpu_grow(&c->attn_ws, &cap, per * c->nthreads));
	c->attn_ws_per_thread = per;
	return 0;
}

/* Element offset of slot 0 of sequence s, KV head h in a token-major fp16
 * or fp32 cache (nseq, cap, nkv, hd); slot j is j * nkv * hd further on. */
static size_t cache_base(const sl_attn_args *a, int s, int h)
{
	return ((size_t)s * a->cap * sl_attn_nkv(a) + (size_t)h) * a->hd;
}

/* The quantised slot j of sequence s (kv_q4): an (nkv, hd) sl_q4 matrix. */
static uint8_t *q4_slot(const sl_attn_args *a, const void *cache, int s, int j)
{
	const size_t sb = sl_q4_bytes((size_t)sl_attn_nkv(a), (size_t)a->hd);
	return (uint8_t *)cache + ((size_t)s * a->cap + (size_t)j) * sb;
}

/* KV head h's row of slot j of sequence s from hd fp32 values: rounded to
 * the cache dtype, or to fp16 and quantised group by group (kv_q4). */
static void store_slot(const sl_attn_args *a, void *cache, int s, int j, int h, const float *src)
{
	const int hd = a->hd;
	if (a->kv_q4) {
		const size_t ng = sl_q4_groups((size_t)hd);
		uint8_t *slot = q4_slot(a, cache, s, j);
		sl_half *meta = sl_q4_meta(slot, (size_t)sl_attn_nkv(a), (size_t)hd);
		sl_half x[SL_Q4_GROUP];
		for (size_t g = 0; g < ng; g++) {
			const int c0 = (int)g * SL_Q4_GROUP, n = SL_MIN(SL_Q4_GROUP, hd - c0);
			const size_t k = (size_t)h * ng + g;
			for (int i = 0; i < n; i++)
				x[i] = sl_float_to_half(src[c0 + i]);
			sl_q4_quantize_group(x, n, slot + k * SL_Q4_CODE_BYTES, &meta[2 * k],
					     &meta[2 * k + 1]);
		}
		return;
	}
	const size_t off = cache_base(a, s, h) + (size_t)j * sl_attn_nkv(a) * hd;
	if (a->kv_f32) {
		memcpy((float *)cache + off, src, sizeof(float) * (size_t)hd);
	} else {
		sl_half *dst = (sl_half *)cache + off;
		for (int d = 0; d < hd; d++)
			dst[d] = sl_float_to_half(src[d]);
	}
}

/* rows slots [j0, j0 + rows) of sequence s, KV head h to dst as packed
 * fp32 rows of hd: the cache's values, dequantised where kv_q4 */
static void load_slots(const sl_attn_args *a, const void *cache, int s, int j0, int h, int rows,
		       float *dst, int simd)
{
	const size_t hd = (size_t)a->hd, nkv = (size_t)sl_attn_nkv(a), stride = nkv * hd;
	if (a->kv_q4) {
		const size_t ng = sl_q4_groups(hd);
		for (int j = 0; j < rows; j++, dst += hd) {
			const uint8_t *slot = q4_slot(a, cache, s, j0 + j);
			const sl_half *meta = sl_q4_meta((void *)slot, nkv, hd);
			for (size_t g = 0; g < ng; g++) {
				const size_t k = (size_t)h * ng + g;
				const uint8_t *codes = slot + k * SL_Q4_CODE_BYTES;
				/* the group's 16 values, each exactly sl_q4_value's */
				float lut[16];
				for (unsigned q = 0; q < 16; q++)
					lut[q] = sl_q4_value(q, meta[2 * k], meta[2 * k + 1]);
				const size_t c0 = g * SL_Q4_GROUP;
				const size_t n = SL_MIN((size_t)SL_Q4_GROUP, hd - c0);
				for (size_t i = 0; i < n; i++)
					dst[c0 + i] = lut[sl_q4_code(codes, (int)i)];
			}
		}
		return;
	}
	size_t off = cache_base(a, s, h) + (size_t)j0 * stride;
	for (int j = 0; j < rows; j++, off += stride, dst += hd) {
		if (a->kv_f32)
			memcpy(dst, (const float *)cache + off, hd * sizeof(float));
		else
			sl_cpu_half_to_float((const sl_half *)cache + off, dst, hd, simd);
	}
}

int sl_cpu_attn_prefill(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	sl_cpu_ctx *c = sl_cpu(b);
	SL_TRY(sl_attn_check_heads("attn_prefill", a));
	const int nh = a->nh, hd = a->hd, hidden = nh * hd, t = a->t;
	const int nkv = sl_attn_nkv(a), grp = nh / nkv, kvw = nkv * hd;
	for (int s = 0; s < a->nseq; s++)
		if (a->npad[s] < 0 || a->npad[s] > t || t - a->npad[s] > a->cap)
			return sl_err(SL_EINVAL, "attn_prefill: sequence %d has %d pad rows of %d (cache %d)",
				      s, a->npad[s], t, a->cap);
	if (a->kv_f32 && a->kv_q4)
		return sl_err(SL_EINVAL, "attn_prefill: kv_f32 and kv_q4 both set");
	SL_TRY(attn_workspace(b, t, hd));
	const int tasks = a->nseq * nkv;
#pragma omp parallel for num_threads(c->nthreads) schedule(dynamic, 1)
	for (int task = 0; task < tasks; task++) {
		const int s = task / nkv, g = task % nkv;
		const int np = a->npad[s], r = t - np;
		float *ws = c->attn_ws + (size_t)omp_get_thread_num() * c->attn_ws_per_thread;
		float *kf = ws, *vf = kf + (size_t)t * hd, *p = vf + (size_t)t * hd;
		for (int i = 0; i < r; i++) {
			const size_t row = ((size_t)s * t + np + i) * kvw + (size_t)g * hd;
			store_slot(a, a->k_cache, s, i, g, a->k_new + row);
			store_slot(a, a->v_cache, s, i, g, a->v_new + row);
		}
		/* attention reads the cached keys and values (rounded to the
		 * cache dtype, or dequantised), exactly as every later decode
		 * step will */
		load_slots(a, a->k_cache, s, 0, g, r, kf, c->simd);
		load_slots(a, a->v_cache, s, 0, g, r, vf, c->simd);
		float *score = a->score ? a->score + (size_t)(s * nkv + g) * a->cap : NULL;
		for (int h = g * grp; h < (g + 1) * grp; h++) { /* the group's query heads */
			for (int i = 0; i < np; i++)
				memset(a->out + ((size_t)s * t + i) * hidden + (size_t)h * hd, 0,
				       sizeof(float) * hd);
			for (int i = 0; i < r; i++) {
				const size_t row = ((size_t)s * t + np + i) * hidden + (size_t)h * hd;
				attend_one(a->q + row, kf, vf, i + 1, hd, p, a->out + row, score);
			}
		}
	}
	return 0;
}

int sl_cpu_attn_decode(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	sl_cpu_ctx *c = sl_cpu(b);
	SL_TRY(sl_attn_check_heads("attn_decode", a));
	const int nh = a->nh, hd = a->hd, hidden = nh * hd;
	const int nkv = sl_attn_nkv(a), grp = nh / nkv, kvw = nkv * hd;
	int maxlen = 0;
	for (int s = 0; s < a->nseq; s++) {
		if (a->len[s] < 0 || a->len[s] >= a->cap)
			return sl_err(SL_EINVAL, "attn_decode: sequence %d holds %d tokens, cache has %d slots",
				      s, a->len[s], a->cap);
		maxlen = SL_MAX(maxlen, a->len[s] + 1);
	}
	if (a->kv_f32 && a->kv_q4)
		return sl_err(SL_EINVAL, "attn_decode: kv_f32 and kv_q4 both set");
	SL_TRY(attn_workspace(b, maxlen, hd));
	const int tasks = a->nseq * nkv;
#pragma omp parallel for num_threads(c->nthreads) schedule(dynamic, 1)
	for (int task = 0; task < tasks; task++) {
		const int s = task / nkv, g = task % nkv;
		const int nk = a->len[s] + 1;
		float *ws = c->attn_ws + (size_t)omp_get_thread_num() * c->attn_ws_per_thread;
		float *kf = ws, *vf = kf + (size_t)maxlen * hd, *p = vf + (size_t)maxlen * hd;
		const size_t kvrow = (size_t)s * kvw + (size_t)g * hd;
		store_slot(a, a->k_cache, s, a->len[s], g, a->k_new + kvrow);
		store_slot(a, a->v_cache, s, a->len[s], g, a->v_new + kvrow);
		load_slots(a, a->k_cache, s, 0, g, nk, kf, c->simd);
		load_slots(a, a->v_cache, s, 0, g, nk, vf, c->simd);
		float *score = a->score ? a->score + (size_t)(s * nkv + g) * a->cap : NULL;
		for (int h = g * grp; h < (g + 1) * grp; h++) { /* the group's query heads */
			const size_t row = (size_t)s * hidden + (size_t)h * hd;
			attend_one(a->q + row, kf, vf, nk, hd, p, a->out + row, score);
		}
	}
	return 0;
}

int sl_cpu_argmax(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		  int32_t *out)
{
#pragma omp parallel for num_threads(sl_cpu(b)->nthreads) schedule(static)
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * ldx;
		int best = 0;
		float bv = xr[0];
		bool finite = isfinite(bv);
		for (int i = 1; i < n; i++) {
			finite &= isfinite(xr[i]);
			if (xr[i] > bv) {
				bv = xr[i];
				best = i;
			}
		}
		out[r] = finite ? best : -1;
	}
	return 0;
}
