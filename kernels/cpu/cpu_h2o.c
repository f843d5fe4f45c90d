/*
 * cpu_h2o.c - H2O heavy-hitter cache maintenance on the CPU: choosing the
 * kept prompt tokens after prefill, and one eviction per decode step, per
 * (sequence, head).  The specification is in backend.h.  K and V rows are
 * token-major (nseq, cap, nh, hd); score and pos are head-major (nseq, nh,
 * cap), so a task's scores are contiguous and its rows are hidden apart.
 * A compressed cache (kv_q4) moves a head's codes and metadata within the
 * slots instead (copy_row).
 */
#include "cpu_internal.h"

#include <omp.h>
#include <string.h>

/*
 * The row index (in rows of hd) of slot j of task (sequence, head) = s * nh
 * + h in a token-major cache (nseq, cap, nh, hd): ((s * cap + j) * nh + h).
 */
static size_t kv_row(int nh, int cap, int task, int j)
{
	const int s = task / nh, h = task - s * nh;
	return ((size_t)s * cap + (size_t)j) * nh + (size_t)h;
}

static void copy_row(const sl_h2o_args *a, void *dst, size_t dst_row, const void *src,
		     size_t src_row)
{
	if (a->kv_q4) {
		/* row (slot * nh + h): head h's codes and its {mn16, scale16}
		 * pairs within the slot's sl_q4 (nh, hd) matrix */
		const size_t nh = (size_t)a->nh, ng = sl_q4_groups((size_t)a->hd);
		const size_t sb = sl_q4_bytes(nh, (size_t)a->hd), cb = ng * SL_Q4_CODE_BYTES,
			     mb = ng * SL_Q4_META_BYTES;
		char *d = (char *)dst + dst_row / nh * sb;
		const char *sp = (const char *)src + src_row / nh * sb;
		const size_t dh = dst_row % nh, sh = src_row % nh;
		memmove(d + dh * cb, sp + sh * cb, cb);
		memmove(d + nh * cb + dh * mb, sp + nh * cb + sh * mb, mb);
		return;
	}
	const size_t es = a->kv_f32 ? 4 : 2, row = (size_t)a->hd * es;
	memmove((char *)dst + dst_row * row, (const char *)src + src_row * row, row);
}

/* candidates sorted best first: higher score, then newer position */
static int by_score_newer(const void *x, const void *y, void *ctx)
{
	const float *sc = ctx;
	int i = *(const int *)x, j = *(const int *)y;
	if (sc[i] != sc[j])
		return sc[i] > sc[j] ? -1 : 1;
	return j - i;
}

static int by_int(const void *x, const void *y)
{
	return *(const int *)x - *(const int *)y;
}

int sl_cpu_h2o_compact(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	const int nh = a->nh;
	for (int s = 0; s < a->nseq; s++) {
		const int B = a->heavy[s] + a->recent[s];
		if (a->n[s] < 0 || a->n[s] > a->cap_in || a->heavy[s] < 0 || a->recent[s] < 0 ||
		    SL_MIN(a->n[s], B) > a->cap)
			return sl_err(SL_EINVAL, "h2o_compact: sequence %d: %d tokens, budget %d+%d, %d slots",
				      s, a->n[s], a->heavy[s], a->recent[s], a->cap);
	}
	int rc = 0;
#pragma omp parallel num_threads(sl_cpu(b)->nthreads)
	{
		int *idx = malloc(sizeof(int) * (size_t)(a->cap_in + 1));
		if (!idx) {
#pragma omp atomic write
			rc = SL_ENOMEM;
		}
#pragma omp for schedule(dynamic, 1)
		for (int task = 0; task < a->nseq * nh; task++) {
			if (!idx)
				continue;
			const int s = task / nh, n = a->n[s], R = a->recent[s], H = a->heavy[s];
			const size_t in = (size_t)task * a->cap_in, out = (size_t)task * a->cap;
			const float *sc = a->score_src + in;
			int kept = 0;
			if (n <= H + R) {
				for (int j = 0; j < n; j++)
					idx[kept++] = j;
			} else {
				/* heavy hitters among the tokens before the recent window */
				const int cand = n - R;
				for (int j = 0; j < cand; j++)
					idx[j] = j;
				qsort_r(idx, (size_t)cand, sizeof *idx, by_score_newer, (void *)sc);
				if (a->evicted)
					for (int j = H; j < cand; j++)
						a->evicted[task] += sc[idx[j]];
				kept = H;
				for (int j = cand; j < n; j++)
					idx[kept++] = j;
				qsort(idx, (size_t)kept, sizeof *idx, by_int); /* position order */
			}
			for (int j = 0; j < kept; j++) {
				const size_t dr = kv_row(nh, a->cap, task, j),
					     sr = kv_row(nh, a->cap_in, task, idx[j]);
				copy_row(a, a->k_cache, dr, a->k_src, sr);
				copy_row(a, a->v_cache, dr, a->v_src, sr);
				a->score[out + j] = sc[idx[j]];
				a->pos[out + j] = idx[j];
			}
			for (int j = kept; j < a->cap; j++) {
				a->score[out + j] = 0.0f;
				a->pos[out + j] = -1;
			}
		}
		free(idx);
	}
	return rc ? sl_err(rc, "h2o_compact: out of memory") : 0;
}

int sl_cpu_h2o_evict(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	const int nh = a->nh;
	for (int s = 0; s < a->nseq; s++)
		if (a->len[s] < 0 || a->len[s] >= a->cap || a->heavy[s] < 0 || a->recent[s] < 0 ||
		    a->len[s] > a->heavy[s] + a->recent[s])
			return sl_err(SL_EINVAL, "h2o_evict: sequence %d holds %d tokens, budget %d+%d, %d slots",
				      s, a->len[s], a->heavy[s], a->recent[s], a->cap);
#pragma omp parallel for num_threads(sl_cpu(b)->nthreads) schedule(static)
	for (int task = 0; task < a->nseq * nh; task++) {
		const int s = task / nh, L = a->len[s], B = a->heavy[s] + a->recent[s];
		const size_t base = (size_t)task * a->cap;
		float *sc = a->score + base;
		int32_t *pos = a->pos + base;
		pos[L] = a->cur[s];
		if (L + 1 <= B)
			continue;
		/* the lowest score outside the recent window; the older on a tie */
		const int32_t edge = a->cur[s] - a->recent[s];
		int v = -1;
		for (int j = 0; j <= L; j++) {
			if (pos[j] > edge)
				continue;
			if (v < 0 || sc[j] < sc[v] || (sc[j] == sc[v] && pos[j] < pos[v]))
				v = j;
		}
		if (v < 0) /* unreachable: the window holds R < B + 1 tokens */
			continue;
		if (a->evicted)
			a->evicted[task] += sc[v];
		if (v != L) {
			const size_t dr = kv_row(nh, a->cap, task, v), sr = kv_row(nh, a->cap, task, L);
			copy_row(a, a->k_cache, dr, a->k_cache, sr);
			copy_row(a, a->v_cache, dr, a->v_cache, sr);
			sc[v] = sc[L];
			pos[v] = pos[L];
		}
		sc[L] = 0.0f;
		pos[L] = -1;
	}
	return 0;
}
