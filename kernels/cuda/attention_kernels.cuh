/*
 * attention_kernels.cuh - attention over the fp16 KV cache (backend.h,
 * sl_attn_args): prefill (causal, left-padded sequences) and one decode
 * step, with the optional H2O score (the probability each query gives each
 * cached slot, added into score).
 *
 * Layouts (b: sequence, h: query head, g: KV head, s: slot, d: dim,
 * hidden = nh * hd, kvw = nkv * hd; grouped-query attention: query head h
 * reads KV head g = h / (nh / nkv), nkv = nh without it):
 *   prefill q, out: fp32 [b][t][hidden], k_new, v_new: fp32 [b][t][kvw],
 *     the first npad[b] rows of sequence b are padding; real row j is
 *     padded row npad[b] + j
 *   decode q, out: fp32 [b][hidden], k_new, v_new: fp32 [b][kvw]
 *   cache: fp16 [b][cap][g][hd], token-major: slot s of sequence b holds
 *     every KV head's row (kvw values), so a (sequence, KV head)'s slots
 *     are kvw apart and one slot's hd values of one head are contiguous
 *   score: fp32 [b][g][cap] (head-major), the sum over g's query heads
 * Attention reads k and v from the cache, that is rounded to fp16, for the
 * new tokens too (the values that later steps will see).
 *
 * A compressed cache (kv_q4, backend.h) holds per slot an sl_q4 (nkv, hd)
 * matrix: sl_q4_store_kernel quantises the new rows into their slots
 * (exactly sl_q4_quantize_group's codes), and the attention kernels read
 * the cache through a view (sl_kv_f16 or sl_kv_q4) that dequantises as it
 * loads, so no fp16 copy of the cache is made.
 *
 * The per-sequence metadata (npad, len) arrive by value in the kernel
 * parameters (sl_cu_ints), for a chunk of sequences per launch: blockIdx
 * picks the sequence within the chunk and the pointers start at the chunk.
 */
#ifndef SL_ATTENTION_KERNELS_CUH
#define SL_ATTENTION_KERNELS_CUH

#include "cuda_device.cuh"

/* ---- prefill: the new rows into the cache, zero padding rows ------------- */

#define SL_PF_STORE_THREADS 256

/*
 * Row i of sequence b: a padding row (i < npad) gets out = 0 over all
 * query heads; a real row j = i - npad has its k and v (all nkv KV heads)
 * rounded to fp16 and written to cache slot j (one contiguous run of kvw
 * values).
 * grid: (t, nseq in chunk); block: 256.
 */
static __global__ void __launch_bounds__(SL_PF_STORE_THREADS)
sl_prefill_store_kernel(int t, int nh, int nkv, int hd, int cap, sl_cu_ints npad,
			const float *__restrict__ k_new, const float *__restrict__ v_new,
			float *__restrict__ out, __half *__restrict__ kc, __half *__restrict__ vc)
{
	const int i = blockIdx.x, b = blockIdx.y;
	const int np = npad.v[b];
	if (i < np) {
		const int hidden = nh * hd;
		const size_t row = ((size_t)b * t + i) * hidden;
		for (int e = threadIdx.x; e < hidden; e += SL_PF_STORE_THREADS)
			out[row + e] = 0.f;
		return;
	}
	const int kvw = nkv * hd;
	const size_t row = ((size_t)b * t + i) * kvw;
	const int j = i - np;
	const size_t slot = ((size_t)b * cap + j) * kvw;
	for (int e = threadIdx.x; e < kvw; e += SL_PF_STORE_THREADS) {
		kc[slot + e] = __float2half_rn(k_new[row + e]);
		vc[slot + e] = __float2half_rn(v_new[row + e]);
	}
}

/* ---- the compressed cache: quantisation and the two views ------------------- */

#define SL_Q4D_GROUP 64 /* sl_q4.h's SL_Q4_GROUP: 32 code bytes, 4 meta bytes */

static __device__ __forceinline__ float sl_q4_bits_to_float(unsigned short u)
{
	return __half2float(__ushort_as_half(u));
}

/* sl_q4_value: q / scale16 + mn16 in fp32 (mn16 when scale16 is 0). */
static __device__ __forceinline__ float sl_q4_dequant(unsigned q, unsigned short mn16,
						      unsigned short scale16)
{
	const float mf = sl_q4_bits_to_float(mn16);
	if (scale16 == 0)
		return mf;
	return __fadd_rn(__fdiv_rn((float)q, sl_q4_bits_to_float(scale16)), mf);
}

/*
 * sl_q4_quantize_group on one group of n (1..64) values, already rounded
 * to fp16 (held as fp32): 32 code bytes and {mn16, scale16}.  The
 * arithmetic is the header's, operation for operation, with the _rn
 * intrinsics so that nvcc contracts nothing into an FMA.
 */
static __device__ void sl_q4_quantize_dev(const float *x, int n, unsigned char *codes,
					  unsigned short *meta)
{
	float mn = x[0], mx = mn;
	for (int i = 1; i < n; i++) {
		mn = x[i] < mn ? x[i] : mn;
		mx = x[i] > mx ? x[i] : mx;
	}
	const unsigned short m16 = __half_as_ushort(__float2half_rn(mn));
	unsigned short s16 = 0;
	if (mx != mn) {
		const float f = __fdiv_rn(15.0f, __fsub_rn(mx, mn));
		s16 = !(f < 65520.0f) ? (unsigned short)0x7bffu
				      : __half_as_ushort(__float2half_rn(f));
	}
	meta[0] = m16;
	meta[1] = s16;
	const float mf = sl_q4_bits_to_float(m16), sf = sl_q4_bits_to_float(s16);
	for (int i = 0; i < SL_Q4D_GROUP; i += 2) {
		unsigned byte = 0;
		for (int e = 0; e < 2; e++) {
			if (s16 == 0 || i + e >= n)
				continue;
			float q = rintf(__fmul_rn(__fsub_rn(x[i + e], mf), sf));
			q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
			byte |= (unsigned)q << (4 * e);
		}
		codes[i >> 1] = (unsigned char)byte;
	}
}

#define SL_Q4_STORE_THREADS 64

/*
 * The new rows into a compressed cache.  Block (i, b) takes row i of
 * sequence b of k_new / v_new ([b][rows][kvw]).  Prefill (decode = 0,
 * meta = npad): rows i < npad[b] are padding, whose out rows (all nh query
 * heads, [b][rows][hidden]) become zero; row i >= npad goes to slot
 * i - npad.  Decode (decode = 1, rows = 1, meta = len): the row goes to
 * slot len[b].  Each thread quantises (KV head, group) pairs of the row,
 * k and v.
 * grid: (rows, nseq in chunk); block: 64.
 */
static __global__ void __launch_bounds__(SL_Q4_STORE_THREADS)
sl_q4_store_kernel(int rows, int nh, int nkv, int hd, int cap, int decode, sl_cu_ints meta,
		   const float *__restrict__ k_new, const float *__restrict__ v_new,
		   float *__restrict__ out, unsigned char *__restrict__ kc,
		   unsigned char *__restrict__ vc)
{
	const int i = blockIdx.x, b = blockIdx.y;
	const int ng = (hd + SL_Q4D_GROUP - 1) / SL_Q4D_GROUP;
	int slot;
	if (decode) {
		slot = meta.v[b];
	} else {
		const int np = meta.v[b];
		if (i < np) {
			const int hidden = nh * hd;
			const size_t orow = ((size_t)b * rows + i) * hidden;
			for (int e = threadIdx.x; e < hidden; e += SL_Q4_STORE_THREADS)
				out[orow + e] = 0.f;
			return;
		}
		slot = i - np;
	}
	const size_t row = ((size_t)b * rows + i) * nkv * hd;
	const size_t sb = (size_t)nkv * ng * (32 + 4);
	const size_t so = ((size_t)b * cap + slot) * sb;
	float x[SL_Q4D_GROUP];
	for (int task = threadIdx.x; task < 2 * nkv * ng; task += SL_Q4_STORE_THREADS) {
		const int kv = task / (nkv * ng), k = task - kv * nkv * ng; /* k = h * ng + g */
		const int h = k / ng, g = k - h * ng;
		const int c0 = g * SL_Q4D_GROUP, n = min(SL_Q4D_GROUP, hd - c0);
		const float *src = (kv ? v_new : k_new) + row + (size_t)h * hd + c0;
		for (int e = 0; e < n; e++)
			x[e] = __half2float(__float2half_rn(src[e]));
		unsigned char *slotp = (kv ? vc : kc) + so;
		sl_q4_quantize_dev(x, n, slotp + (size_t)k * 32,
				   reinterpret_cast<unsigned short *>(slotp + (size_t)nkv * ng * 32) + 2 * k);
	}
}

/*
 * The cache as the attention kernels read it: slot j, dim d of one
 * (sequence, KV head), as fp32; make's nh is the cache's heads (nkv).
 * load<VEC>(j, d0, f): VEC consecutive dims from d0 (VEC 8: d0 % 8 == 0,
 * the alignment the decode kernel checks).
 */
template <int VEC>
static __device__ __forceinline__ void sl_load_halves(const __half *p, float *f)
{
	if constexpr (VEC == 8) {
		sl_load_half8(p, f);
	} else {
		static_assert(VEC == 1, "VEC is 1 or 8");
		f[0] = __half2float(p[0]);
	}
}

struct sl_kv_f16 {
	static constexpr bool q4 = false;
	const __half *p; /* slot 0 of (b, h); slot j is j * nh * hd further on */
	int hidden;
	static __device__ __forceinline__ sl_kv_f16 make(const void *cache, int b, int h, int nh,
							 int hd, int cap)
	{
		const int hidden = nh * hd;
		sl_kv_f16 v = { (const __half *)cache + (size_t)b * cap * hidden + (size_t)h * hd,
				hidden };
		return v;
	}
	__device__ __forceinline__ float at(int j, int d) const
	{
		return __half2float(p[(size_t)j * hidden + d]);
	}
	template <int VEC>
	__device__ __forceinline__ void load(int j, int d0, float *f) const
	{
		sl_load_halves<VEC>(p + (size_t)j * hidden + d0, f);
	}
};

struct sl_kv_q4 {
	static constexpr bool q4 = true;
	const unsigned char *codes;  /* head h's codes in slot 0 of b */
	const unsigned short *meta;  /* head h's {mn16, scale16} in slot 0 of b */
	size_t sb;                   /* slot bytes */
	static __device__ __forceinline__ sl_kv_q4 make(const void *cache, int b, int h, int nh,
							int hd, int cap)
	{
		const int ng = (hd + SL_Q4D_GROUP - 1) / SL_Q4D_GROUP;
		const size_t sb = (size_t)nh * ng * 36;
		const unsigned char *s0 = (const unsigned char *)cache + (size_t)b * cap * sb;
		sl_kv_q4 v = { s0 + (size_t)h * ng * 32,
			       reinterpret_cast<const unsigned short *>(s0 + (size_t)nh * ng * 32) +
				       2 * (size_t)h * ng,
			       sb };
		return v;
	}
	__device__ __forceinline__ float at(int j, int d) const
	{
		const int g = d >> 6, i = d & 63;
		const unsigned char *c = codes + (size_t)j * sb + (size_t)g * 32;
		const unsigned short *m = reinterpret_cast<const unsigned short *>(
						  reinterpret_cast<const unsigned char *>(meta) +
						  (size_t)j * sb) + 2 * g;
		return sl_q4_dequant((c[i >> 1] >> ((i & 1) * 4)) & 15u, m[0], m[1]);
	}
	template <int VEC>
	__device__ __forceinline__ void load(int j, int d0, float *f) const
	{
		if constexpr (VEC == 8) { /* 4 code bytes of one group, 4-byte aligned */
			const int g = d0 >> 6, i = d0 & 63;
			const unsigned w = *reinterpret_cast<const unsigned *>(
				codes + (size_t)j * sb + (size_t)g * 32 + (i >> 1));
			const unsigned short *m = reinterpret_cast<const unsigned short *>(
							  reinterpret_cast<const unsigned char *>(meta) +
							  (size_t)j * sb) + 2 * g;
			const unsigned short m0 = m[0], m1 = m[1];
#pragma unroll
			for (int e = 0; e < 8; e++)
				f[e] = sl_q4_dequant((w >> (4 * e)) & 15u, m0, m1);
		} else {
			f[0] = at(j, d0);
		}
	}
};

/* ---- dot products of one row per lane against rows shared by the warp ------ */

/*
 * Row stride (floats) of a shared tile in which each lane reads its own
 * row: with hd % 4 == 0 the rows are read as float4 and the stride is
 * hd + 4 or hd + 8, whichever is an odd number of float4s (the 8 lanes of
 * each quarter-warp then hit disjoint banks); otherwise hd + 1 (scalar
 * reads, an odd stride for even hd).
 */
static __host__ __device__ inline int sl_lane_row_stride(int hd)
{
	return (hd & 3) == 0 ? hd + (((hd >> 2) & 1) ? 8 : 4) : hd + 1;
}

/*
 * s[r] = dot(mine[0..hd), shared[r * hd .. r * hd + hd)) for r < ROWS:
 * mine is this lane's row (stride from sl_lane_row_stride), shared holds
 * ROWS rows that every lane reads (broadcast).  The sum runs over d in
 * order with fmaf, the same in both branches.
 */
template <int ROWS>
static __device__ __forceinline__ void sl_lane_dots(const float *mine, const float *shared,
						    int hd, float *s)
{
#pragma unroll
	for (int r = 0; r < ROWS; r++)
		s[r] = 0.f;
	if ((hd & 3) == 0) { /* both 16-byte aligned: see the callers' layouts */
		const float4 *m4 = reinterpret_cast<const float4 *>(mine);
		const float4 *s4 = reinterpret_cast<const float4 *>(shared);
		const int n4 = hd >> 2;
		for (int i = 0; i < n4; i++) {
			const float4 a = m4[i];
#pragma unroll
			for (int r = 0; r < ROWS; r++) {
				const float4 b = s4[r * n4 + i];
				s[r] = fmaf(b.x, a.x, s[r]);
				s[r] = fmaf(b.y, a.y, s[r]);
				s[r] = fmaf(b.z, a.z, s[r]);
				s[r] = fmaf(b.w, a.w, s[r]);
			}
		}
	} else {
		for (int d = 0; d < hd; d++) {
			const float a = mine[d];
#pragma unroll
			for (int r = 0; r < ROWS; r++)
				s[r] = fmaf(shared[r * hd + d], a, s[r]);
		}
	}
}

/* ---- prefill: causal flash attention (fp32 SIMT) ---------------------------- */

#define SL_PF_THREADS 128
#define SL_PF_WARPS (SL_PF_THREADS / 32)
#define SL_PF_ROWS 4                          /* query rows per warp */
#define SL_PF_BQ (SL_PF_WARPS * SL_PF_ROWS) /* query rows per block */
#define SL_PF_BK 32                           /* keys per tile: one per lane */

/* dynamic shared memory of sl_prefill_attn_kernel for head dim hd */
static inline size_t sl_prefill_attn_smem(int hd)
{
	return (size_t)(SL_PF_BQ * hd + SL_PF_BK * sl_lane_row_stride(hd) + SL_PF_BK * hd) *
	       sizeof(float);
}

/*
 * Block (x, h, b) computes real query rows [16x, 16x + 16) of sequence b,
 * query head h, over KV head h / (nh / nkv)'s real keys [0, min(L, 16x + 16)), L = t - npad[b], in tiles
 * of 32 keys staged in shared memory as fp32, with the online softmax
 * (running max m and sum l per row, the output rescaled when m grows).
 * Each warp owns 4 query rows; in the score step lane l takes key l of the
 * tile (K rows padded, see sl_lane_row_stride), in the PV step
 * lane l owns dims l, l + 32, ... (DPL of them: hd <= 32 * DPL).
 * ml (optional): [b][h][t] (row max, row sum) for the score pass.
 * grid: (ceil(max L / 16), nh, nseq in chunk); block: 128;
 * shared: sl_prefill_attn_smem(hd).
 */
template <int DPL, typename KV>
static __global__ void __launch_bounds__(SL_PF_THREADS)
sl_prefill_attn_kernel(int t, int nh, int nkv, int hd, int cap, sl_cu_ints npad,
		       const float *__restrict__ q, const void *__restrict__ kc,
		       const void *__restrict__ vc, float *__restrict__ out,
		       float2 *__restrict__ ml)
{
	SL_CU_DYN_SMEM(float, sl_smem);
	const int b = blockIdx.z, h = blockIdx.y;
	const int np = npad.v[b];
	const int L = t - np;
	const int j0 = blockIdx.x * SL_PF_BQ;
	if (j0 >= L) /* the whole block leaves: no barrier is skipped */
		return;
	const int hidden = nh * hd;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int ks = sl_lane_row_stride(hd);
	/* 16-byte aligned pieces: BQ * hd and BK * ks are multiples of 4 floats
	 * where the float4 path runs (hd % 4 == 0) */
	float *Qs = sl_smem;             /* [BQ][hd] */
	float *Ks = Qs + SL_PF_BQ * hd;  /* [BK][ks] */
	float *Vs = Ks + SL_PF_BK * ks;  /* [BK][hd] */
	const int g = h / (nh / nkv);
	const KV kb = KV::make(kc, b, g, nkv, hd, cap);
	const KV vb = KV::make(vc, b, g, nkv, hd, cap);

	/* the query tile (rows past L are zero and never written back) */
	const float *qb = q + ((size_t)b * t + np + j0) * hidden + (size_t)h * hd;
	for (int e = tid; e < SL_PF_BQ * hd; e += SL_PF_THREADS) {
		const int r = e / hd, d = e - r * hd;
		Qs[e] = j0 + r < L ? qb[(size_t)r * hidden + d] : 0.f;
	}

	float o[SL_PF_ROWS][DPL];
	float m[SL_PF_ROWS], l[SL_PF_ROWS];
#pragma unroll
	for (int r = 0; r < SL_PF_ROWS; r++) {
		m[r] = -INFINITY;
		l[r] = 0.f;
#pragma unroll
		for (int i = 0; i < DPL; i++)
			o[r][i] = 0.f;
	}

	const int kend = min(L, j0 + SL_PF_BQ); /* causal: no query here sees a key past this */
	const float *qr = Qs + warp * SL_PF_ROWS * hd;
	for (int k0 = 0; k0 < kend; k0 += SL_PF_BK) {
		const int nk = min(SL_PF_BK, kend - k0);
		__syncthreads(); /* the previous tile is consumed (and Qs is written) */
		for (int e = tid; e < SL_PF_BK * hd; e += SL_PF_THREADS) {
			const int kk = e / hd, d = e - kk * hd;
			float kv = 0.f, vv = 0.f;
			if (kk < nk) {
				kv = kb.at(k0 + kk, d);
				vv = vb.at(k0 + kk, d);
			}
			Ks[kk * ks + d] = kv;
			Vs[e] = vv;
		}
		__syncthreads();

		/* scores of key k0 + lane against this warp's rows */
		float s[SL_PF_ROWS];
		sl_lane_dots<SL_PF_ROWS>(Ks + lane * ks, qr, hd, s);

		/* online softmax; s becomes the unnormalised probability */
		const int key = k0 + lane;
#pragma unroll
		for (int r = 0; r < SL_PF_ROWS; r++) {
			const int qj = j0 + warp * SL_PF_ROWS + r;
			const bool ok = lane < nk && key <= qj && qj < L;
			const float sr = ok ? s[r] : -INFINITY;
			const float mn = fmaxf(m[r], sl_warp_max(sr));
			const float corr = m[r] == -INFINITY ? 0.f : expf(m[r] - mn);
			const float p = ok ? expf(sr - mn) : 0.f;
			l[r] = l[r] * corr + sl_warp_sum(p);
			m[r] = mn;
#pragma unroll
			for (int i = 0; i < DPL; i++)
				o[r][i] *= corr;
			s[r] = p;
		}

		/* o += p v over the tile's keys */
		for (int kk = 0; kk < nk; kk++) {
			float pk[SL_PF_ROWS];
#pragma unroll
			for (int r = 0; r < SL_PF_ROWS; r++)
				pk[r] = __shfl_sync(SL_CU_FULL_MASK, s[r], kk);
			const float *vr = Vs + kk * hd;
#pragma unroll
			for (int i = 0; i < DPL; i++) {
				const int d = lane + 32 * i;
				if (d < hd) {
					const float vv = vr[d];
#pragma unroll
					for (int r = 0; r < SL_PF_ROWS; r++)
						o[r][i] = fmaf(pk[r], vv, o[r][i]);
				}
			}
		}
	}

#pragma unroll
	for (int r = 0; r < SL_PF_ROWS; r++) {
		const int qj = j0 + warp * SL_PF_ROWS + r;
		if (qj >= L)
			continue;
		const float inv = 1.f / l[r]; /* > 0: key 0 is always visible */
		float *orow = out + ((size_t)b * t + np + qj) * hidden + (size_t)h * hd;
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			const int d = lane + 32 * i;
			if (d < hd)
				orow[d] = o[r][i] * inv;
		}
		if (ml && lane == 0)
			ml[((size_t)b * nh + h) * t + qj] = make_float2(m[r], l[r]);
	}
}

/* ---- prefill: the H2O column sums -------------------------------------------- */

#define SL_PS_THREADS 128
#define SL_PS_ROWS 4                                       /* keys per warp */
#define SL_PS_KEYS ((SL_PS_THREADS / 32) * SL_PS_ROWS)     /* keys per block */
#define SL_PS_BQ 32                                        /* queries per tile: one per lane */

static inline size_t sl_prefill_score_smem(int hd)
{
	return (size_t)(SL_PS_KEYS * hd + SL_PS_BQ * sl_lane_row_stride(hd) + 2 * SL_PS_BQ) *
	       sizeof(float);
}

/*
 * score[b][g][kj] += sum over g's query heads h, then over real queries
 * qj >= kj, of exp(q.k - m[h][qj]) / l[h][qj] with the (m, l) the attention
 * kernel saved: the probabilities are recomputed, not stored.  Block
 * (x, g, b) owns keys [16x, 16x + 16) of KV head g (4 per warp, in shared
 * memory) and, for each query head of the group in turn, walks the query
 * tiles from its first key to L; lane l takes query l of the tile.  Each
 * key has one owner, so the add into score needs no atomics.
 * grid: (ceil(max L / 16), nkv, nseq in chunk); block: 128;
 * shared: sl_prefill_score_smem(hd).
 */
template <typename KV>
static __global__ void __launch_bounds__(SL_PS_THREADS)
sl_prefill_score_kernel(int t, int nh, int nkv, int hd, int cap, sl_cu_ints npad,
			const float *__restrict__ q, const void *__restrict__ kc,
			const float2 *__restrict__ ml, float *__restrict__ score)
{
	SL_CU_DYN_SMEM(float, sl_smem);
	const int b = blockIdx.z, g = blockIdx.y, grp = nh / nkv;
	const int np = npad.v[b];
	const int L = t - np;
	const int c0 = blockIdx.x * SL_PS_KEYS;
	if (c0 >= L)
		return;
	const int hidden = nh * hd;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int qs = sl_lane_row_stride(hd);
	float *Ks = sl_smem;              /* [KEYS][hd] */
	float *Qs = Ks + SL_PS_KEYS * hd; /* [BQ][qs], 16-byte aligned as above */
	float *Ms = Qs + SL_PS_BQ * qs;   /* [BQ] row max */
	float *Is = Ms + SL_PS_BQ;            /* [BQ] 1 / row sum */

	const KV kb = KV::make(kc, b, g, nkv, hd, cap);
	for (int e = tid; e < SL_PS_KEYS * hd; e += SL_PS_THREADS) {
		const int kk = e / hd, d = e - kk * hd;
		Ks[e] = c0 + kk < L ? kb.at(c0 + kk, d) : 0.f;
	}

	float acc[SL_PS_ROWS];
#pragma unroll
	for (int r = 0; r < SL_PS_ROWS; r++)
		acc[r] = 0.f;
	const float *kr = Ks + warp * SL_PS_ROWS * hd;
	for (int h = g * grp; h < (g + 1) * grp; h++) {
		const float *qb = q + ((size_t)b * t + np) * hidden + (size_t)h * hd;
		const float2 *mlb = ml + ((size_t)b * nh + h) * t;
		for (int q0 = c0; q0 < L; q0 += SL_PS_BQ) {
			const int nq = min(SL_PS_BQ, L - q0);
			__syncthreads(); /* the previous tile is consumed (and Ks is written) */
			for (int e = tid; e < SL_PS_BQ * hd; e += SL_PS_THREADS) {
				const int qq = e / hd, d = e - qq * hd;
				Qs[qq * qs + d] = qq < nq ? qb[(size_t)(q0 + qq) * hidden + d] : 0.f;
			}
			for (int e = tid; e < SL_PS_BQ; e += SL_PS_THREADS) {
				const float2 v = e < nq ? mlb[q0 + e] : make_float2(0.f, 1.f);
				Ms[e] = v.x;
				Is[e] = 1.f / v.y;
			}
			__syncthreads();

			float s[SL_PS_ROWS];
			sl_lane_dots<SL_PS_ROWS>(Qs + lane * qs, kr, hd, s);
			const int qj = q0 + lane;
#pragma unroll
			for (int r = 0; r < SL_PS_ROWS; r++) {
				const int kj = c0 + warp * SL_PS_ROWS + r;
				if (lane < nq && kj <= qj && kj < L)
					acc[r] += expf(s[r] - Ms[lane]) * Is[lane];
			}
		}
	}
#pragma unroll
	for (int r = 0; r < SL_PS_ROWS; r++) {
		const float tot = sl_warp_sum(acc[r]);
		const int kj = c0 + warp * SL_PS_ROWS + r;
		if (lane == 0 && kj < L)
			score[((size_t)b * nkv + g) * cap + kj] += tot;
	}
}

/* ---- decode: one query per (sequence, query head) --------------------------------------- */

#define SL_DEC_THREADS 256


/* key groups of the PV pass: threads split into groups of hd / VEC */
static inline int sl_decode_groups(int hd, int vec)
{
	return SL_DEC_THREADS / (hd / vec);
}

/* dynamic shared memory of sl_decode_attn_kernel for up to maxlen cached tokens */
static inline size_t sl_decode_smem(int hd, int vec, int maxlen)
{
	return (size_t)(3 * hd + 32 + sl_decode_groups(hd, vec) * hd + maxlen + 1) * sizeof(float);
}

/*
 * Block (x, b): sequence b, query heads [x * hpb, x * hpb + hpb), one after
 * the other (hpb is 1, or a whole group of nh / nkv heads when the block
 * must be the only writer of the group's score row), n = len[b] cached
 * tokens.  Query head h reads KV head g = h / (nh / nkv).  The first query
 * head of each group writes the new k, v (fp16) of g to slot n (the
 * group's other heads take them from k_new, rounded alike, and never read
 * slot n of the cache); then attention of q over slots [0, n]:
 *   1. scores: groups of lpk lanes take one key each (lane g of a group
 *      holds dims [VEC * (g + lpk c), +VEC) of q in registers), partial dots
 *      reduced within the group; the scores go to shared memory;
 *   2. max and sum over the block (exact softmax, no rescaling);
 *   3. score[b][g][j] += p[j] (optional; thread j's slots are the same for
 *      every head of the block, so the group's sum needs no atomics);
 *   4. PV: thread (kg, ch) sums p[j] v[j][ch*VEC, +VEC) over keys
 *      j = kg, kg + groups, ...; the groups' partials are added at the end.
 * Slots [0, n) are read once each for k and once for v per query head;
 * slot n comes from the registers of the new token; nothing past n is read.
 * The (b, g) rows are kvw = nkv * hd apart (token-major cache); a row's
 * hd values are contiguous.
 * VEC = 8: 16-byte loads (hd % 8 == 0, cache 16-byte aligned: then every
 * row start, (slot * nkv + g) * hd halves in, is aligned too), lpk =
 * the power of two >= hd / 8, CPL = 1; VEC = 1: half loads, lpk = 32,
 * CPL = 8.  hd <= 256.
 * grid: (nh / hpb, nseq in chunk); block: 256; shared: sl_decode_smem(hd, VEC, max len).
 */
template <int VEC, int CPL, typename KV>
static __global__ void __launch_bounds__(SL_DEC_THREADS)
sl_decode_attn_kernel(int nh, int nkv, int hpb, int hd, int cap, int lpk, sl_cu_ints len,
		      const float *__restrict__ q, const float *__restrict__ k_new,
		      const float *__restrict__ v_new, void *__restrict__ kc,
		      void *__restrict__ vc, float *__restrict__ out, float *__restrict__ score)
{
	SL_CU_DYN_SMEM(float, sl_smem);
	const int b = blockIdx.y;
	const int n = len.v[b];
	const int hidden = nh * hd, kvw = nkv * hd, grp = nh / nkv;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int nchunk = hd / VEC;
	const int groups = SL_DEC_THREADS / nchunk;
	float *qs = sl_smem;             /* [hd] */
	float *kns = qs + hd;            /* [hd] new k, as stored */
	float *vns = kns + hd;           /* [hd] new v, as stored */
	float *red = vns + hd;           /* [32] */
	float *part = red + 32;          /* [groups][hd] */
	float *ps = part + groups * hd;  /* [n + 1] scores, then probabilities */

	for (int h = (int)blockIdx.x * hpb; h < ((int)blockIdx.x + 1) * hpb; h++) {
		const int g = h / grp;
		const size_t qoff = (size_t)b * hidden + (size_t)h * hd;
		const size_t kvoff = (size_t)b * kvw + (size_t)g * hd;
		const KV kb = KV::make(kc, b, g, nkv, hd, cap);
		const KV vb = KV::make(vc, b, g, nkv, hd, cap);
		for (int d = tid; d < hd; d += SL_DEC_THREADS) {
			qs[d] = q[qoff + d];
			if constexpr (KV::q4) { /* sl_q4_store_kernel wrote slot n before */
				kns[d] = kb.at(n, d);
				vns[d] = vb.at(n, d);
			} else {
				const __half kh = __float2half_rn(k_new[kvoff + d]);
				const __half vh = __float2half_rn(v_new[kvoff + d]);
				if (h % grp == 0) {
					/* slot 0 of (b, g); slot j is j * kvw further on */
					const size_t cbase = (size_t)b * cap * kvw + (size_t)g * hd;
					((__half *)kc)[cbase + (size_t)n * kvw + d] = kh;
					((__half *)vc)[cbase + (size_t)n * kvw + d] = vh;
				}
				kns[d] = __half2float(kh);
				vns[d] = __half2float(vh);
			}
		}
		__syncthreads();

		/* 1. scores */
		const int gl = lane & (lpk - 1);
		const int grpi = warp * (32 / lpk) + lane / lpk;
		const int ngrp = (SL_DEC_THREADS / 32) * (32 / lpk);
		float qr[CPL][VEC];
#pragma unroll
		for (int c = 0; c < CPL; c++) {
			const int ch = gl + c * lpk;
#pragma unroll
			for (int e = 0; e < VEC; e++)
				qr[c][e] = ch < nchunk ? qs[ch * VEC + e] : 0.f;
		}
		for (int j0 = 0; j0 <= n; j0 += ngrp) { /* uniform trip count: full-warp shuffles */
			const int j = j0 + grpi;
			float s = 0.f;
			if (j < n) {
#pragma unroll
				for (int c = 0; c < CPL; c++) {
					const int ch = gl + c * lpk;
					if (ch < nchunk) {
						float kv[VEC];
						kb.template load<VEC>(j, ch * VEC, kv);
#pragma unroll
						for (int e = 0; e < VEC; e++)
							s = fmaf(qr[c][e], kv[e], s);
					}
				}
			} else if (j == n) {
#pragma unroll
				for (int c = 0; c < CPL; c++) {
					const int ch = gl + c * lpk;
					if (ch < nchunk) {
#pragma unroll
						for (int e = 0; e < VEC; e++)
							s = fmaf(qr[c][e], kns[ch * VEC + e], s);
					}
				}
			}
			s = sl_group_sum(s, lpk);
			if (gl == 0 && j <= n)
				ps[j] = s;
		}

		__syncthreads(); /* every score is in ps before anyone reads them */

		/* 2. softmax */
		float mx = -INFINITY;
		for (int j = tid; j <= n; j += SL_DEC_THREADS)
			mx = fmaxf(mx, ps[j]);
		mx = sl_block_max(mx, red);
		float sum = 0.f;
		for (int j = tid; j <= n; j += SL_DEC_THREADS) {
			const float p = expf(ps[j] - mx);
			ps[j] = p;
			sum += p;
		}
		sum = sl_block_sum(sum, red); /* its barriers also publish the new ps */
		const float inv = 1.f / sum;

		/* 3. H2O score */
		if (score) {
			float *sc = score + ((size_t)b * nkv + g) * cap;
			for (int j = tid; j <= n; j += SL_DEC_THREADS)
				sc[j] += ps[j] * inv;
		}

		/* 4. PV */
		const int kg = tid / nchunk, ch = tid - kg * nchunk;
		if (kg < groups) {
			float acc[VEC];
#pragma unroll
			for (int e = 0; e < VEC; e++)
				acc[e] = 0.f;
			for (int j = kg; j <= n; j += groups) {
				const float p = ps[j];
				if (j < n) {
					float vv[VEC];
					vb.template load<VEC>(j, ch * VEC, vv);
#pragma unroll
					for (int e = 0; e < VEC; e++)
						acc[e] = fmaf(p, vv[e], acc[e]);
				} else {
#pragma unroll
					for (int e = 0; e < VEC; e++)
						acc[e] = fmaf(p, vns[ch * VEC + e], acc[e]);
				}
			}
#pragma unroll
			for (int e = 0; e < VEC; e++)
				part[kg * hd + ch * VEC + e] = acc[e];
		}
		__syncthreads();
		for (int d = tid; d < hd; d += SL_DEC_THREADS) {
			float o = 0.f;
			for (int gi = 0; gi < groups; gi++)
				o += part[gi * hd + d];
			out[qoff + d] = o * inv;
		}
		__syncthreads(); /* part, ps and the rows are free for the next head */
	}
}

#endif
