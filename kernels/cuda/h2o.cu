/*
 * h2o.cu - h2o_compact and h2o_evict (backend.h, sl_h2o_args): argument
 * checks (the CPU backend's, plus shapes and NULLs), the copy word size,
 * the compact workspace (shared memory, or the queue's attn scratch where
 * a block's candidates do not fit in it), and the launches in chunks of
 * sequences (the per-sequence host arrays travel by value in the kernel
 * parameters).  The kernels are described in h2o_kernels.cuh.
 */
#include "cuda_internal.cuh"
#include "h2o_kernels.cuh"

static int sl_cu_h2o_check(const sl_h2o_args *a, const char *op)
{
	if (a->nseq < 0 || a->nh <= 0 || a->hd <= 0 || a->cap <= 0)
		return sl_err(SL_EINVAL, "cuda %s: bad shape nseq=%d nh=%d hd=%d cap=%d", op, a->nseq,
			      a->nh, a->hd, a->cap);
	if (a->kv_q4 && a->kv_f32)
		return sl_err(SL_EINVAL, "cuda %s: kv_f32 and kv_q4 both set", op);
	if ((long long)a->nh * a->hd > (1 << 30))
		return sl_err(SL_EINVAL, "cuda %s: hidden size %lld too large", op,
			      (long long)a->nh * a->hd);
	if (a->nseq > 0 && (!a->k_cache || !a->v_cache || !a->score || !a->pos || !a->heavy ||
			    !a->recent))
		return sl_err(SL_EINVAL, "cuda %s: NULL argument", op);
	return 0;
}

/* The bytes of a head's row in a slot: its values, or (kv_q4) its codes
 * (*cb) and its {mn16, scale16} pairs (*mb) (sl_h2o_word). */
static void sl_cu_h2o_row(const sl_h2o_args *a, size_t *cb, size_t *mb)
{
	if (a->kv_q4) {
		const size_t ng = sl_q4_groups((size_t)a->hd);
		*cb = ng * SL_Q4_CODE_BYTES;
		*mb = ng * SL_Q4_META_BYTES;
		return;
	}
	*cb = (size_t)a->hd * (a->kv_f32 ? 4 : 2);
	*mb = 0;
}

/* The widest word (16, 4, 2 or 1 bytes) that divides a cache row's parts
 * and that every cache pointer is aligned to. */
static int sl_cu_h2o_word(const sl_h2o_args *a, const void *const *ptrs, int nptr)
{
	size_t cb, mb;
	sl_cu_h2o_row(a, &cb, &mb);
	static const int sizes[] = { 16, 4, 2 };
	for (int k = 0; k < 3; k++) {
		const size_t w = (size_t)sizes[k];
		bool ok = cb % w == 0 && mb % w == 0;
		for (int i = 0; i < nptr; i++)
			ok = ok && (uintptr_t)ptrs[i] % w == 0;
		if (ok)
			return sizes[k];
	}
	return 1;
}

/* ---- compact ---------------------------------------------------------------- */

template <typename W>
static int sl_cu_compact_launch(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	const int nh = a->nh;
	size_t cb, mb;
	sl_cu_h2o_row(a, &cb, &mb);
	const int cw = (int)(cb / sizeof(W)), mw = (int)(mb / sizeof(W));
	const size_t row = (size_t)(cw + mw); /* words per (slot, head) */
	auto *kfn = sl_h2o_compact_kernel<W>;
	const size_t optin = sl_cu_ctx(b)->smem_optin;
	const size_t smem_max = optin > 48 * 1024 ? optin : 48 * 1024;
	sl_cu_ints meta;
	for (int s0 = 0; s0 < a->nseq; s0 += SL_H2O_CSEQ) {
		const int ns = SL_MIN(SL_H2O_CSEQ, a->nseq - s0);
		int pmax = 0; /* the most candidates that a block sorts */
		for (int i = 0; i < ns; i++) {
			const int n = a->n[s0 + i], H = a->heavy[s0 + i], R = a->recent[s0 + i];
			meta.v[SL_H2O_CMETA * i] = n;
			meta.v[SL_H2O_CMETA * i + 1] = H;
			meta.v[SL_H2O_CMETA * i + 2] = R;
			if (n > H + R && (H > 0 || a->evicted))
				pmax = SL_MAX(pmax, n - R);
		}
		/* the workspace: shared memory where it fits, else global scratch
		 * (at most scratch_max of it, fewer blocks per launch) */
		const size_t wsz = pmax ? sl_h2o_ws_bytes(pmax) : 0;
		const int tasks = ns * nh;
		int per = tasks;
		size_t smem = SL_H2O_SMEM_HEAD + wsz;
		void *ws = NULL;
		if (smem > smem_max) {
			const size_t fit = sl_cu_ctx(b)->scratch_max / wsz;
			per = (int)SL_MIN((size_t)tasks, fit > 0 ? fit : 1);
			SL_TRY(sl_cu_scratch_reserve(b, q, &q->attn, (size_t)per * wsz,
						     "h2o_compact scratch"));
			ws = q->attn.p;
			smem = SL_H2O_SMEM_HEAD;
		} else {
			SL_TRY(sl_cu_smem_limit(b, (const void *)kfn, smem, "h2o_compact"));
		}
		const size_t src = (size_t)s0 * nh * a->cap_in, dst = (size_t)s0 * nh * a->cap;
		for (int tb = 0; tb < tasks; tb += per) {
			const int nb = SL_MIN(per, tasks - tb);
			SL_CU_LAUNCH(kfn, nb, SL_H2O_THREADS, smem, q->stream,
				nh, cw, mw, a->cap_in, a->cap, pmax, tb, meta,
				(const W *)a->k_src + src * row, (const W *)a->v_src + src * row,
				a->score_src + src, (W *)a->k_cache + dst * row,
				(W *)a->v_cache + dst * row, a->score + dst, (int *)a->pos + dst,
				a->evicted ? a->evicted + (size_t)s0 * nh : NULL, ws, wsz);
			SL_CU_LAUNCHED("sl_h2o_compact_kernel");
		}
	}
	return 0;
}

int sl_cu_h2o_compact(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	SL_TRY(sl_cu_h2o_check(a, "h2o_compact"));
	if (a->nseq == 0)
		return 0;
	if (!a->n || !a->k_src || !a->v_src || !a->score_src || a->cap_in < 0)
		return sl_err(SL_EINVAL, "cuda h2o_compact: NULL source or n, or cap_in %d", a->cap_in);
	for (int s = 0; s < a->nseq; s++) {
		const int n = a->n[s], H = a->heavy[s], R = a->recent[s];
		if (n < 0 || n > a->cap_in || H < 0 || R < 0 || SL_MIN(n, H + R) > a->cap)
			return sl_err(SL_EINVAL,
				      "cuda h2o_compact: sequence %d: %d tokens, budget %d+%d, %d slots", s,
				      n, H, R, a->cap);
		if (n > H + R && n - R > (1 << 26))
			return sl_err(SL_EUNSUPPORTED,
				      "cuda h2o_compact: sequence %d: %d candidates (at most %d)", s,
				      n - R, 1 << 26);
	}
	q = sl_cu_queue(b, q);
	const void *ptrs[4] = { a->k_src, a->v_src, a->k_cache, a->v_cache };
	switch (sl_cu_h2o_word(a, ptrs, 4)) {
	case 16:
		return sl_cu_compact_launch<uint4>(b, q, a);
	case 4:
		return sl_cu_compact_launch<unsigned>(b, q, a);
	case 2:
		return sl_cu_compact_launch<unsigned short>(b, q, a);
	default:
		return sl_cu_compact_launch<unsigned char>(b, q, a);
	}
}

/* ---- evict ------------------------------------------------------------------ */

template <typename W>
static int sl_cu_evict_launch(sl_queue *q, const sl_h2o_args *a)
{
	const int nh = a->nh;
	size_t cb, mb;
	sl_cu_h2o_row(a, &cb, &mb);
	const int cw = (int)(cb / sizeof(W)), mw = (int)(mb / sizeof(W));
	const size_t wrow = (size_t)(cw + mw); /* words per (slot, head) */
	auto *kfn = sl_h2o_evict_kernel<W>;
	sl_cu_ints meta;
	for (int s0 = 0; s0 < a->nseq; s0 += SL_H2O_ESEQ) {
		const int ns = SL_MIN(SL_H2O_ESEQ, a->nseq - s0);
		for (int i = 0; i < ns; i++) {
			meta.v[SL_H2O_EMETA * i] = a->len[s0 + i];
			meta.v[SL_H2O_EMETA * i + 1] = a->cur[s0 + i];
			meta.v[SL_H2O_EMETA * i + 2] = a->heavy[s0 + i];
			meta.v[SL_H2O_EMETA * i + 3] = a->recent[s0 + i];
		}
		const size_t off = (size_t)s0 * nh * a->cap;
		SL_CU_LAUNCH(kfn, dim3((unsigned)nh, (unsigned)ns), SL_H2O_EVICT_THREADS, 0, q->stream,
			nh, cw, mw, a->cap, meta, (W *)a->k_cache + off * wrow,
			(W *)a->v_cache + off * wrow, a->score + off, (int *)a->pos + off,
			a->evicted ? a->evicted + (size_t)s0 * nh : NULL);
		SL_CU_LAUNCHED("sl_h2o_evict_kernel");
	}
	return 0;
}

int sl_cu_h2o_evict(sl_backend *b, sl_queue *q, const sl_h2o_args *a)
{
	SL_TRY(sl_cu_h2o_check(a, "h2o_evict"));
	if (a->nseq == 0)
		return 0;
	if (!a->len || !a->cur)
		return sl_err(SL_EINVAL, "cuda h2o_evict: len or cur is NULL");
	for (int s = 0; s < a->nseq; s++) {
		const int L = a->len[s], H = a->heavy[s], R = a->recent[s];
		if (L < 0 || L >= a->cap || L > H + R || H < 0 || R < 0)
			return sl_err(SL_EINVAL,
				      "cuda h2o_evict: sequence %d holds %d tokens, budget %d+%d, %d slots", s,
				      L, H, R, a->cap);
	}
	q = sl_cu_queue(b, q);
	const void *ptrs[2] = { a->k_cache, a->v_cache };
	switch (sl_cu_h2o_word(a, ptrs, 2)) {
	case 16:
		return sl_cu_evict_launch<uint4>(q, a);
	case 4:
		return sl_cu_evict_launch<unsigned>(q, a);
	case 2:
		return sl_cu_evict_launch<unsigned short>(q, a);
	default:
		return sl_cu_evict_launch<unsigned char>(q, a);
	}
}
