/*
 * h2o_kernels.cuh - H2O heavy-hitter cache maintenance (backend.h,
 * sl_h2o_args): compact (the kept prompt tokens after prefill) and evict
 * (one eviction after a decode step), one block per (sequence, head).
 *
 * Layouts (b: sequence, h: head, s: slot):
 *   caches: [b][cap][h][hd], token-major (k_src, v_src: cap_in slots),
 *     fp16 or fp32: the row of slot s, head h of sequence b is row
 *     (b * cap + s) * nh + h, so a (sequence, head)'s rows are nh rows
 *     apart; rows are copied as raw words of W (16, 4, 2 or 1 bytes, the
 *     widest that the row size and every cache pointer allow), so both
 *     element types share the code and the bits move unchanged; a
 *     compressed cache's head row is its codes and its metadata within
 *     the slot (sl_h2o_word)
 *   score, pos: [b][h][cap], head-major (score_src: cap_in)
 *   evicted: [b][h]
 * Both ops only move data, compare floats and (for evicted) add them in
 * the CPU backend's order, so their results equal the CPU's bit for bit.
 *
 * The per-sequence metadata arrive by value in the kernel parameters
 * (sl_cu_ints), interleaved: SL_H2O_CMETA ints per sequence for compact
 * (n, heavy, recent), SL_H2O_EMETA for evict (len, cur, heavy, recent).
 */
#ifndef SL_H2O_KERNELS_CUH
#define SL_H2O_KERNELS_CUH

#include "cuda_device.cuh"

#define SL_H2O_THREADS 256 /* compact */
#define SL_H2O_EVICT_THREADS 128
/*
 * Word w of the row of head h in slot S (S = b * cap + s; a row is cw + mw
 * words): fp16 and fp32 caches have mw = 0 and rows nh * cw words apart
 * within a slot; a compressed cache (kv_q4, an sl_q4 (nh, hd) matrix per
 * slot) has cw words of head h's codes at h * cw and mw words of its
 * {mn16, scale16} pairs after all heads' codes, at nh * cw + h * mw.
 */
static __device__ __forceinline__ size_t sl_h2o_word(int nh, int cw, int mw, size_t S, int h,
						     int w)
{
	const size_t base = S * (size_t)nh * (size_t)(cw + mw);
	return w < cw ? base + (size_t)h * cw + w
		      : base + (size_t)nh * cw + (size_t)h * mw + (size_t)(w - cw);
}

/* dynamic shared memory before the workspace: the scan's warp sums */
#define SL_H2O_SMEM_HEAD 32
static_assert(SL_H2O_THREADS / 32 * sizeof(int) <= SL_H2O_SMEM_HEAD, "warp sums fit");
#define SL_H2O_CMETA 3
#define SL_H2O_EMETA 4
/* sequences per launch */
#define SL_H2O_CSEQ (SL_CU_PARAM_INTS / SL_H2O_CMETA)
#define SL_H2O_ESEQ (SL_CU_PARAM_INTS / SL_H2O_EMETA)

/* ---- compact: workspace --------------------------------------------------- */

/* The smallest power of two >= n (n >= 1). */
static __host__ __device__ inline int sl_h2o_pow2(int n)
{
	int p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

/*
 * Workspace bytes of one block whose candidates number at most cand: the
 * sort keys (u64, padded to a power of two) and then one int per
 * candidate (its mark, then its output slot), in 16-byte units.
 */
static __host__ __device__ inline size_t sl_h2o_ws_bytes(int cand)
{
	const size_t b = (size_t)sl_h2o_pow2(cand) * 8 + (size_t)cand * 4;
	return (b + 15) & ~(size_t)15;
}

/*
 * A sort key that orders candidates as the CPU backend does (best first:
 * the higher score, then the newer position) when keys are compared as
 * unsigned integers, largest first: the score's bits mapped to an
 * order-preserving unsigned integer in the high half (with -0 taken as +0,
 * which compares equal to it), the position in the low half.
 */
static __device__ __forceinline__ unsigned long long sl_h2o_key(float s, int pos)
{
	if (s == 0.f)
		s = 0.f;
	unsigned u = __float_as_uint(s);
	u ^= (u & 0x80000000u) ? 0xffffffffu : 0x80000000u;
	return ((unsigned long long)u << 32) | (unsigned)pos;
}

/* ---- compact ---------------------------------------------------------------- */

/*
 * Keep all n tokens of a (sequence, head) if n <= heavy + recent, else the
 * last recent ones and the heavy best scoring among the cand = n - recent
 * before them (the CPU's order: higher score, then newer), and write them
 * to slots [0, kept) in position order; slots [kept, cap) get score 0 and
 * pos -1 (their cache rows are left alone).  The evicted candidates'
 * scores are added to evicted in the CPU's order: best first.
 *
 * Selection: a bitonic sort (descending) of the candidates' keys
 * (sl_h2o_key), then a block-wide prefix count over positions gives each
 * kept heavy hitter its output slot.  The workspace (sl_h2o_ws_bytes(pmax
 * candidates), keys first, then an int per candidate) is dynamic shared
 * memory (after SL_H2O_SMEM_HEAD bytes), or where ws is not NULL that many
 * bytes of ws per block (wsz bytes apart) in global memory.  Dynamic shared
 * memory: SL_H2O_SMEM_HEAD bytes, plus the workspace where ws is NULL.
 *
 * grid: tasks (sequence, head) tb .. tb + gridDim.x of the chunk; block:
 * SL_H2O_THREADS; meta: (n, heavy, recent) per sequence of the chunk;
 * every pointer starts at the chunk's first sequence.
 */
template <typename W>
static __global__ void __launch_bounds__(SL_H2O_THREADS)
sl_h2o_compact_kernel(int nh, int cw, int mw, int cap_in, int cap, int pmax, int tb, sl_cu_ints meta,
		      const W *__restrict__ k_src, const W *__restrict__ v_src,
		      const float *__restrict__ score_src, W *__restrict__ k_cache,
		      W *__restrict__ v_cache, float *__restrict__ score, int *__restrict__ pos,
		      float *__restrict__ evicted, void *ws, size_t wsz)
{
	SL_CU_DYN_SMEM(unsigned long long, sl_h2o_smem);
	int *wsum = (int *)sl_h2o_smem; /* [SL_H2O_THREADS / 32] */
	const int task = tb + (int)blockIdx.x;
	const int s = task / nh, h = task - s * nh;
	const int n = meta.v[SL_H2O_CMETA * s], H = meta.v[SL_H2O_CMETA * s + 1],
		  R = meta.v[SL_H2O_CMETA * s + 2];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const size_t in = (size_t)task * cap_in, out = (size_t)task * cap;
	const float *sc = score_src + in;

	/* heavy: kept candidates; first: the first recent token (slot heavy) */
	int heavy = 0, first = 0, kept = n;
	int *inv = NULL; /* output slot -> candidate, for slots < heavy */
	/* without heavy hitters and without evicted, the order does not matter */
	if (n > H + R && (H > 0 || evicted)) {
		const int cand = n - R, P = sl_h2o_pow2(cand);
		unsigned long long *keys =
			ws ? (unsigned long long *)((char *)ws + (size_t)blockIdx.x * wsz)
			   : sl_h2o_smem + SL_H2O_SMEM_HEAD / sizeof(unsigned long long);
		int *slot = (int *)(keys + sl_h2o_pow2(pmax));
		for (int i = tid; i < P; i += SL_H2O_THREADS)
			keys[i] = i < cand ? sl_h2o_key(sc[i], i) : 0ull;
		for (int i = tid; i < cand; i += SL_H2O_THREADS)
			slot[i] = 0;
		__syncthreads();

		/* bitonic sort, largest first */
		for (int k = 2; k <= P; k <<= 1)
			for (int j = k >> 1; j > 0; j >>= 1) {
				for (int t = tid; t < P / 2; t += SL_H2O_THREADS) {
					const int i = ((t & ~(j - 1)) << 1) | (t & (j - 1)), l = i + j;
					const unsigned long long a = keys[i], c = keys[l];
					if ((a < c) == ((i & k) == 0)) {
						keys[i] = c;
						keys[l] = a;
					}
				}
				__syncthreads();
			}

		/* mark the heavy hitters; the evicted scores, one thread, in the
		 * CPU's order (a float sum depends on it) */
		for (int r = tid; r < H; r += SL_H2O_THREADS)
			slot[(int)(unsigned)keys[r]] = 1;
		if (evicted && tid == 0) {
			float acc = evicted[task];
			int r = H;
			for (; r + 8 <= cand; r += 8) {
				float v[8];
#pragma unroll
				for (int u = 0; u < 8; u++)
					v[u] = sc[(int)(unsigned)keys[r + u]];
#pragma unroll
				for (int u = 0; u < 8; u++)
					acc += v[u];
			}
			for (; r < cand; r++)
				acc += sc[(int)(unsigned)keys[r]];
			evicted[task] = acc;
		}
		__syncthreads();

		/* output slot of each heavy hitter: the marks before it */
		int base = 0;
		for (int t0 = 0; t0 < cand; t0 += SL_H2O_THREADS) {
			const int i = t0 + tid;
			const int f = i < cand ? slot[i] : 0;
			int x = f;
#pragma unroll
			for (int o = 1; o < 32; o <<= 1) {
				const int y = __shfl_sync(SL_CU_FULL_MASK, x, (lane - o) & 31);
				if (lane >= o)
					x += y;
			}
			if (lane == 31)
				wsum[warp] = x;
			__syncthreads();
			int before = 0, total = 0;
#pragma unroll
			for (int w = 0; w < SL_H2O_THREADS / 32; w++) {
				const int v = wsum[w];
				before += w < warp ? v : 0;
				total += v;
			}
			if (i < cand)
				slot[i] = f ? base + before + x - 1 : -1;
			base += total;
			__syncthreads(); /* wsum is read before the next tile writes it */
		}

		/* the keys are no longer needed: their space holds the inverse */
		inv = (int *)keys;
		for (int i = tid; i < cand; i += SL_H2O_THREADS)
			if (slot[i] >= 0)
				inv[slot[i]] = i;
		__syncthreads();
		heavy = H;
		first = cand;
		kept = H + R;
	} else if (n > H + R) {
		heavy = 0;
		first = n - R;
		kept = R;
	}

	/* scores and positions of every slot */
	for (int j = tid; j < cap; j += SL_H2O_THREADS) {
		float v = 0.f;
		int p = -1;
		if (j < kept) {
			p = j < heavy ? inv[j] : first + (j - heavy);
			v = sc[p];
		}
		score[out + j] = v;
		pos[out + j] = p;
	}
	/* the kept rows: slot j's row (s, j, h), words from sl_h2o_word */
	const int wrow = cw + mw;
	for (int e = tid; e < kept * wrow; e += SL_H2O_THREADS) {
		const int j = e / wrow, w = e - j * wrow;
		const int p = j < heavy ? inv[j] : first + (j - heavy);
		const size_t src = sl_h2o_word(nh, cw, mw, (size_t)s * cap_in + p, h, w),
			     dst = sl_h2o_word(nh, cw, mw, (size_t)s * cap + j, h, w);
		k_cache[dst] = k_src[src];
		v_cache[dst] = v_src[src];
	}
}

/* ---- evict ------------------------------------------------------------------ */

/* The victim order: the lower score, then the older position, then the
 * lower slot (the CPU's scan keeps the first on a full tie); j < 0 is
 * "none yet". */
static __device__ __forceinline__ void sl_h2o_min_merge(float &s, int &p, int &j, float s2, int p2,
							int j2)
{
	if (j2 < 0)
		return;
	if (j < 0 || s2 < s || (s2 == s && (p2 < p || (p2 == p && j2 < j)))) {
		s = s2;
		p = p2;
		j = j2;
	}
}

/*
 * One decode step's eviction for each (sequence, head): pos[len] = cur;
 * when len + 1 > heavy + recent, the victim is the lowest scoring slot
 * among [0, len] whose position is <= cur - recent (the older on a tie); its
 * score is added to evicted, the new token's row, score and position move
 * into its slot (unless it is the new token), and slot len is freed (score
 * 0, pos -1).
 * grid: (nh, sequences of the chunk); block: SL_H2O_EVICT_THREADS; meta:
 * (len, cur, heavy, recent) per sequence; pointers start at the chunk.
 */
template <typename W>
static __global__ void __launch_bounds__(SL_H2O_EVICT_THREADS)
sl_h2o_evict_kernel(int nh, int cw, int mw, int cap, sl_cu_ints meta, W *__restrict__ k_cache,
		    W *__restrict__ v_cache, float *__restrict__ score, int *__restrict__ pos,
		    float *__restrict__ evicted)
{
	__shared__ float rs[SL_H2O_EVICT_THREADS / 32];
	__shared__ int rp[SL_H2O_EVICT_THREADS / 32], rj[SL_H2O_EVICT_THREADS / 32];
	__shared__ int victim;
	const int b = blockIdx.y, h = (int)blockIdx.x, task = b * nh + h;
	const int L = meta.v[SL_H2O_EMETA * b], cur = meta.v[SL_H2O_EMETA * b + 1];
	const int H = meta.v[SL_H2O_EMETA * b + 2], R = meta.v[SL_H2O_EMETA * b + 3];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const size_t base = (size_t)task * cap;
	float *sc = score + base;
	int *ps = pos + base;
	if (L + 1 <= H + R) { /* room for the new token: the whole block leaves */
		if (tid == 0)
			ps[L] = cur;
		return;
	}

	/* the new token (slot L) is at cur, whatever pos[L] holds now */
	const int edge = cur - R;
	float bs = 0.f;
	int bp = 0, bj = -1;
	for (int j = tid; j <= L; j += SL_H2O_EVICT_THREADS) {
		const int p = j == L ? cur : ps[j];
		if (p <= edge)
			sl_h2o_min_merge(bs, bp, bj, sc[j], p, j);
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float s2 = __shfl_xor_sync(SL_CU_FULL_MASK, bs, o);
		const int p2 = __shfl_xor_sync(SL_CU_FULL_MASK, bp, o);
		const int j2 = __shfl_xor_sync(SL_CU_FULL_MASK, bj, o);
		sl_h2o_min_merge(bs, bp, bj, s2, p2, j2);
	}
	if (lane == 0) {
		rs[warp] = bs;
		rp[warp] = bp;
		rj[warp] = bj;
	}
	__syncthreads();
	if (tid == 0) {
		for (int w = 1; w < SL_H2O_EVICT_THREADS / 32; w++)
			sl_h2o_min_merge(bs, bp, bj, rs[w], rp[w], rj[w]);
		victim = bj;
	}
	__syncthreads();
	const int v = victim;
	if (v < 0) { /* unreachable: the window holds recent < heavy + recent + 1 tokens */
		if (tid == 0)
			ps[L] = cur;
		return;
	}
	if (v != L) {
		/* slot L's row of head h over slot v's */
		for (int w = tid; w < cw + mw; w += SL_H2O_EVICT_THREADS) {
			const size_t src = sl_h2o_word(nh, cw, mw, (size_t)b * cap + L, h, w),
				     dst = sl_h2o_word(nh, cw, mw, (size_t)b * cap + v, h, w);
			k_cache[dst] = k_cache[src];
			v_cache[dst] = v_cache[src];
		}
	}
	if (tid == 0) {
		if (evicted)
			evicted[task] += sc[v];
		if (v != L) {
			sc[v] = sc[L];
			ps[v] = cur;
		}
		sc[L] = 0.f;
		ps[L] = -1;
	}
}

#endif
