/*
 * attention.cu - attn_prefill and attn_decode (backend.h, sl_attn_args):
 * argument checks, the choice of kernel variant (and of the cache's view:
 * fp16 or compressed), and the launches in
 * chunks of sequences (the per-sequence npad / len travel by value in the
 * kernel parameters, SL_CU_PARAM_INTS sequences per launch).  The kernels
 * and their shapes are described in attention_kernels.cuh.  Grouped-query
 * attention (nkv < nh): q and out have nh heads per row, k_new, v_new and
 * the cache nkv; offsets into the two kinds of tensor differ.
 */
#include "cuda_internal.cuh"
#include "attention_kernels.cuh"

static int sl_cu_attn_check(const sl_attn_args *a, const char *op)
{
	if (a->nseq < 0 || a->nh <= 0 || a->hd <= 0 || a->t < 0 || a->cap <= 0)
		return sl_err(SL_EINVAL, "cuda %s: bad shape nseq=%d nh=%d hd=%d t=%d cap=%d", op,
			      a->nseq, a->nh, a->hd, a->t, a->cap);
	if (a->hd > 256)
		return sl_err(SL_EUNSUPPORTED, "cuda %s: head dim %d is over the 256 supported", op,
			      a->hd);
	if (a->kv_f32) /* the kernels read and write fp16 caches only */
		return sl_err(SL_EUNSUPPORTED,
			      "cuda %s: an fp32 KV cache (--kv-dtype f32) runs on the CPU backend only in this build",
			      op);
	if (a->kv_q4 && a->kv_f32)
		return sl_err(SL_EINVAL, "cuda %s: kv_f32 and kv_q4 both set", op);
	char who[40];
	snprintf(who, sizeof who, "cuda %s", op);
	SL_TRY(sl_attn_check_heads(who, a));
	if ((long long)a->nh * a->hd > (1 << 30))
		return sl_err(SL_EINVAL, "cuda %s: hidden size %lld too large", op,
			      (long long)a->nh * a->hd);
	if (a->nseq > 0 && (!a->q || !a->k_new || !a->v_new || !a->out || !a->k_cache ||
			    !a->v_cache))
		return sl_err(SL_EINVAL, "cuda %s: NULL tensor", op);
	return 0;
}

/* The cache from sequence s0 on (fp16 or compressed slots of nkv heads,
 * backend.h). */
static void *sl_cu_kv_at(const sl_attn_args *a, void *cache, size_t s0)
{
	return (char *)cache +
	       s0 * (size_t)a->cap * sl_kv_slot_bytes(sl_attn_nkv(a), a->hd, false, a->kv_q4);
}

/* The new rows of sequences [s0, s0 + ns) into a compressed cache: meta
 * holds their npad (prefill) or len (decode). */
static int sl_cu_q4_store(sl_backend *b, cudaStream_t st, const sl_attn_args *a, bool decode,
			  const sl_cu_ints &meta, int s0, int ns)
{
	const int rows = decode ? 1 : a->t, nkv = sl_attn_nkv(a);
	const size_t act = (size_t)s0 * rows * a->nh * a->hd; /* q, out */
	const size_t kact = (size_t)s0 * rows * nkv * a->hd;  /* k_new, v_new */
	SL_CU_LAUNCH(sl_q4_store_kernel, dim3((unsigned)rows, (unsigned)ns), SL_Q4_STORE_THREADS,
		     0, st, rows, a->nh, nkv, a->hd, a->cap, decode ? 1 : 0, meta, a->k_new + kact,
		     a->v_new + kact, a->out + act,
		     (unsigned char *)sl_cu_kv_at(a, a->k_cache, (size_t)s0),
		     (unsigned char *)sl_cu_kv_at(a, a->v_cache, (size_t)s0));
	SL_CU_LAUNCHED("sl_q4_store_kernel");
	return 0;
}

/* ---- prefill -------------------------------------------------------------- */

template <int DPL, typename KV>
static int sl_cu_prefill_launch(sl_backend *b, cudaStream_t st, dim3 grid, size_t smem,
				const sl_attn_args *a, const sl_cu_ints &np, size_t s0, float2 *ml)
{
	const size_t hidden = (size_t)a->nh * a->hd;
	const size_t act = s0 * (size_t)a->t * hidden;
	auto *kfn = sl_prefill_attn_kernel<DPL, KV>; /* the template's comma */
	SL_TRY(sl_cu_smem_limit(b, (const void *)kfn, smem, "attn_prefill"));
	SL_CU_LAUNCH(kfn, grid, SL_PF_THREADS, smem, st,
		a->t, a->nh, sl_attn_nkv(a), a->hd, a->cap, np, a->q + act,
		sl_cu_kv_at(a, a->k_cache, s0),
		sl_cu_kv_at(a, a->v_cache, s0), a->out + act, ml);
	SL_CU_LAUNCHED("sl_prefill_attn_kernel");
	return 0;
}

template <typename KV>
static int sl_cu_prefill_chunk(sl_backend *b, cudaStream_t st, dim3 grid, size_t smem,
			       const sl_attn_args *a, const sl_cu_ints &np, size_t s0, float2 *ml)
{
	if (a->hd <= 64)
		return sl_cu_prefill_launch<2, KV>(b, st, grid, smem, a, np, s0, ml);
	if (a->hd <= 128)
		return sl_cu_prefill_launch<4, KV>(b, st, grid, smem, a, np, s0, ml);
	return sl_cu_prefill_launch<8, KV>(b, st, grid, smem, a, np, s0, ml);
}

int sl_cu_attn_prefill(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	SL_TRY(sl_cu_attn_check(a, "attn_prefill"));
	if (a->nseq == 0 || a->t == 0)
		return 0;
	if (!a->npad)
		return sl_err(SL_EINVAL, "cuda attn_prefill: npad is NULL");
	for (int s = 0; s < a->nseq; s++)
		if (a->npad[s] < 0 || a->npad[s] > a->t || a->t - a->npad[s] > a->cap)
			return sl_err(SL_EINVAL,
				      "cuda attn_prefill: sequence %d: npad %d with t %d does not fit cap %d",
				      s, a->npad[s], a->t, a->cap);
	q = sl_cu_queue(b, q);
	cudaStream_t st = q->stream;
	const int t = a->t, nh = a->nh, hd = a->hd, cap = a->cap, nkv = sl_attn_nkv(a);
	const size_t hidden = (size_t)nh * hd, kvw = (size_t)nkv * hd;

	/* sequences per launch; with a score the (m, l) scratch bounds it too */
	int per = SL_CU_PARAM_INTS;
	float2 *ml = NULL;
	if (a->score) {
		const size_t per_seq = (size_t)nh * t * sizeof(float2);
		/* the score pass keeps (row max, row sum) per query: sequences
		 * run in chunks whose scratch stays under the cap */
		size_t fit = sl_cu_ctx(b)->scratch_max / per_seq;
		if (fit < 1)
			fit = 1;
		if (fit < (size_t)per)
			per = (int)fit;
		const int use = SL_MIN(per, a->nseq);
		SL_TRY(sl_cu_scratch_reserve(b, q, &q->attn, (size_t)use * per_seq,
					     "attn_prefill scratch"));
		ml = (float2 *)q->attn.p;
	}
	const size_t smem = sl_prefill_attn_smem(hd);
	const size_t smem_score = sl_prefill_score_smem(hd);
	const void *score_fn = a->kv_q4 ? (const void *)sl_prefill_score_kernel<sl_kv_q4>
					: (const void *)sl_prefill_score_kernel<sl_kv_f16>;
	if (a->score)
		SL_TRY(sl_cu_smem_limit(b, score_fn, smem_score, "attn_prefill score"));

	sl_cu_ints np;
	for (int s0 = 0; s0 < a->nseq; s0 += per) {
		const int ns = SL_MIN(per, a->nseq - s0);
		int maxl = 0;
		for (int i = 0; i < ns; i++) {
			np.v[i] = a->npad[s0 + i];
			maxl = SL_MAX(maxl, t - np.v[i]);
		}
		const size_t act = (size_t)s0 * t * hidden, kact = (size_t)s0 * t * kvw;

		/* the new rows into the cache (quantised where kv_q4), zeros
		 * into the padding rows */
		if (a->kv_q4) {
			SL_TRY(sl_cu_q4_store(b, st, a, false, np, s0, ns));
		} else {
			const size_t cache = (size_t)s0 * cap * kvw;
			SL_CU_LAUNCH(sl_prefill_store_kernel, dim3((unsigned)t, (unsigned)ns),
				     SL_PF_STORE_THREADS, 0, st,
				t, nh, nkv, hd, cap, np, a->k_new + kact, a->v_new + kact, a->out + act,
				(__half *)a->k_cache + cache, (__half *)a->v_cache + cache);
			SL_CU_LAUNCHED("sl_prefill_store_kernel");
		}
		if (maxl == 0)
			continue;

		dim3 grid((unsigned)sl_cu_div_up(maxl, SL_PF_BQ), (unsigned)nh, (unsigned)ns);
		if (a->kv_q4)
			SL_TRY(sl_cu_prefill_chunk<sl_kv_q4>(b, st, grid, smem, a, np, s0, ml));
		else
			SL_TRY(sl_cu_prefill_chunk<sl_kv_f16>(b, st, grid, smem, a, np, s0, ml));

		if (a->score) { /* one block per KV head: it sums its group */
			dim3 sgrid((unsigned)sl_cu_div_up(maxl, SL_PS_KEYS), (unsigned)nkv, (unsigned)ns);
			auto *sfn = a->kv_q4 ? sl_prefill_score_kernel<sl_kv_q4>
					     : sl_prefill_score_kernel<sl_kv_f16>;
			SL_CU_LAUNCH(sfn, sgrid, SL_PS_THREADS, smem_score, st,
				t, nh, nkv, hd, cap, np, a->q + act,
				sl_cu_kv_at(a, a->k_cache, (size_t)s0), ml,
				a->score + (size_t)s0 * nkv * cap);
			SL_CU_LAUNCHED("sl_prefill_score_kernel");
		}
	}
	return 0;
}

/* ---- decode ---------------------------------------------------------------- */

template <int VEC, int CPL, typename KV>
static int sl_cu_decode_launch(sl_backend *b, cudaStream_t st, const sl_attn_args *a)
{
	const int nh = a->nh, hd = a->hd, cap = a->cap, nkv = sl_attn_nkv(a);
	const size_t hidden = (size_t)nh * hd, kvw = (size_t)nkv * hd;
	/* query heads per block: one, or with a score a whole group, whose
	 * probabilities the block then adds into the group's score row in
	 * order (one writer: no atomics, the same sum every run) */
	const int hpb = a->score ? nh / nkv : 1;
	const int nchunk = hd / VEC;
	int lpk = 32;
	if (VEC == 8) { /* the smallest power of two that covers a row */
		lpk = 1;
		while (lpk < nchunk)
			lpk <<= 1;
	}
	/* a pointer: the template's comma would split the macro arguments */
	auto *kfn = sl_decode_attn_kernel<VEC, CPL, KV>;
	sl_cu_ints len;
	for (int s0 = 0; s0 < a->nseq; s0 += SL_CU_PARAM_INTS) {
		const int ns = SL_MIN(SL_CU_PARAM_INTS, a->nseq - s0);
		int maxlen = 0;
		for (int i = 0; i < ns; i++) {
			len.v[i] = a->len[s0 + i];
			maxlen = SL_MAX(maxlen, len.v[i]);
		}
		const size_t smem = sl_decode_smem(hd, VEC, maxlen);
		SL_TRY(sl_cu_smem_limit(b, (const void *)kfn, smem, "attn_decode"));
		const size_t act = (size_t)s0 * hidden, kact = (size_t)s0 * kvw;
		if (KV::q4) /* the new token quantised into slot len first */
			SL_TRY(sl_cu_q4_store(b, st, a, true, len, s0, ns));
		SL_CU_LAUNCH(kfn, dim3((unsigned)(nh / hpb), (unsigned)ns), SL_DEC_THREADS, smem, st,
			nh, nkv, hpb, hd, cap, lpk, len, a->q + act, a->k_new + kact, a->v_new + kact,
			sl_cu_kv_at(a, a->k_cache, (size_t)s0), sl_cu_kv_at(a, a->v_cache, (size_t)s0),
			a->out + act,
			a->score ? a->score + (size_t)s0 * nkv * cap : NULL);
		SL_CU_LAUNCHED("sl_decode_attn_kernel");
	}
	return 0;
}

int sl_cu_attn_decode(sl_backend *b, sl_queue *q, const sl_attn_args *a)
{
	SL_TRY(sl_cu_attn_check(a, "attn_decode"));
	if (a->nseq == 0)
		return 0;
	if (!a->len)
		return sl_err(SL_EINVAL, "cuda attn_decode: len is NULL");
	for (int s = 0; s < a->nseq; s++)
		if (a->len[s] < 0 || a->len[s] >= a->cap)
			return sl_err(SL_EINVAL,
				      "cuda attn_decode: sequence %d: len %d leaves no free slot in cap %d", s,
				      a->len[s], a->cap);
	q = sl_cu_queue(b, q);
	if (a->kv_q4) { /* 8 codes are 4 bytes of one group: 4-byte alignment */
		const bool vec8 = a->hd % 8 == 0 && ((uintptr_t)a->k_cache & 3) == 0 &&
				  ((uintptr_t)a->v_cache & 3) == 0;
		if (vec8)
			return sl_cu_decode_launch<8, 1, sl_kv_q4>(b, q->stream, a);
		return sl_cu_decode_launch<1, 8, sl_kv_q4>(b, q->stream, a);
	}
	const bool vec8 = a->hd % 8 == 0 && ((uintptr_t)a->k_cache & 15) == 0 &&
			  ((uintptr_t)a->v_cache & 15) == 0;
	if (vec8)
		return sl_cu_decode_launch<8, 1, sl_kv_f16>(b, q->stream, a);
	return sl_cu_decode_launch<1, 8, sl_kv_f16>(b, q->stream, a);
}
