/*
 * cpu_amx.c - --cpu-gemm amx and bf16: the prefill's GEMMs (above the
 * direct kernel's rows) in bf16, on Intel AMX tiles (amx: x86-64 CPUs with
 * AMX-TILE, AMX-BF16 and AVX512-BF16, Sapphire Rapids and later) or with
 * AVX512-BF16 dot products (bf16: AMD Zen 4 and later, Intel Cooper Lake
 * and later; block_dp), from the same packed operands.
 *
 * What it computes: each x value rounded to bf16 (round to nearest even),
 * each fp16 weight rounded to bf16 the same way, their products summed in
 * fp32 by the tiles (TDPBF16PS: 32 products of a row and a column per
 * instruction, k in increasing chunks of 32), then sluice's epilogue (bias,
 * alpha, ReLU, accumulation).  So it is the GEMM of the bf16-rounded
 * operands, as transformers' bf16 models compute it: about 3 significant
 * bits fewer than the fp16 weights hold and 16 fewer than fp32
 * activations, and not batch invariant (the decode's rows and short
 * prompts run the direct kernel in fp32).  Opt-in for that reason;
 * tests/test_ops.c holds it to a plain reference on the rounded operands.
 *
 * Layout.  x is rounded into a bf16 copy (rows padded with zeros to a
 * multiple of 32).  Weights go a panel of columns (weight rows) at a time,
 * each thread its own: per chunk of 32 k and 16 columns one 1 KiB tile in
 * the tiles' pair layout (row p holds, for each of the 16 columns, the
 * values at k = 2p and 2p + 1 of the chunk), columns past n zero.  A 32 x
 * 32 block of the output is four accumulator tiles, fed per k chunk by two
 * tiles of x rows and two of weight columns.  k must be a multiple of 32
 * (every model's widths are); sl_cpu_amx_gemm refuses other shapes and the
 * caller runs the packed kernel instead.
 */
#include "cpu_internal.h"

#include <stdio.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define BF16_TARGET "avx512f,avx512bf16,avx512bw,avx512vl,f16c"
#define AMX_TARGET "amx-tile,amx-bf16," BF16_TARGET

enum {
	AMX_PANEL_BYTES = 1 << 20, /* a thread's packed weight panel, at most */
};

/* The tile configuration (palette 1): eight tiles of 16 rows of 64 bytes. */
typedef struct amx_cfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} amx_cfg;

bool sl_cpu_bf16_available(char *why, size_t n)
{
	unsigned a, b, c, d;
	/* AVX512 F, BW, VL (the backend's ISA check saw the OS keep zmm state) */
	if (sl_cpu_x86_isa() < SL_CPU_AVX512 || !__get_cpuid_count(7, 0, &a, &b, &c, &d) ||
	    !(b & (1u << 30)) || !(b & (1u << 31))) {
		snprintf(why, n, "this CPU has no AVX-512 (F, BW, VL)");
		return false;
	}
	if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) {
		snprintf(why, n, "this CPU has no AVX512-BF16");
		return false;
	}
	return true;
}

bool sl_cpu_amx_available(char *why, size_t n)
{
	unsigned a, b, c, d;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
		snprintf(why, n, "this CPU has no AMX-TILE and AMX-BF16");
		return false;
	}
	if (!sl_cpu_bf16_available(why, n))
		return false;
	/* Linux hands the tile state to a process that asks for it */
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
		snprintf(why, n, "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)");
		return false;
	}
	return true;
}

/* In static storage, not built on the stack: GCC's _tile_loadconfig (12,
 * amxtileintrin.h) tells the compiler it reads 8 bytes, so at -O3 the
 * stores of the tiles' columns and rows were dropped as dead and
 * LDTILECFG read a stack slot's leftovers (#GP: SIGSEGV on the first
 * --cpu-gemm amx product, found on a Xeon with AMX on 2026-12-07). */
static const amx_cfg tiles_cfg = {
	.palette = 1,
	.colsb = { 64, 64, 64, 64, 64, 64, 64, 64 },
	.rows = { 16, 16, 16, 16, 16, 16, 16, 16 },
};

__attribute__((target(AMX_TARGET)))
static void tiles_config(void)
{
	_tile_loadconfig(&tiles_cfg);
}

/* x rows [r0, r1) of the padded copy (rows past m zero), rounded to bf16. */
__attribute__((target(BF16_TARGET)))
static void pack_x(const sl_gemm_args *a, uint16_t *xb, int r0, int r1)
{
	const int k = a->k;
	for (int r = r0; r < r1; r++) {
		uint16_t *dst = xb + (size_t)r * k;
		if (r >= a->m) {
			memset(dst, 0, (size_t)k * sizeof *dst);
			continue;
		}
		const float *src = a->x + (size_t)r * a->ldx;
		for (int kk = 0; kk < k; kk += 32) {
			const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + kk + 16), _mm512_loadu_ps(src + kk));
			_mm512_storeu_si512(dst + kk, (__m512i)v);
		}
	}
}

/* r[c] element p becomes r[p] element c: a 16 x 16 transpose of 32-bit
 * elements in four rounds of shuffles (pairs of elements, of pairs, of
 * 128-bit lanes, of lane pairs). */
__attribute__((target(BF16_TARGET)))
static void transpose16(__m512i r[16])
{
	__m512i t[16], u[16];
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
	}
	/* u[4j + e], lane L: elements 4L + e of rows 4j .. 4j + 3 */
	for (int j = 0; j < 16; j += 4) {
		u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
		u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
		u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
		u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
	}
	/* row 4L + e: lane L of u[e], u[4 + e], u[8 + e], u[12 + e] */
	for (int e = 0; e < 4; e++) {
		const __m512i s0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88),
			      s1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd),
			      s2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88),
			      s3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
		r[e] = _mm512_shuffle_i32x4(s0, s2, 0x88);
		r[4 + e] = _mm512_shuffle_i32x4(s1, s3, 0x88);
		r[8 + e] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
		r[12 + e] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
	}
}

/* Weight rows (columns of the product) [c0, c0 + cols) as tiles: for each
 * group of 16 columns g and k chunk q, the tile at ((g * nq) + q) * 512
 * values, its row p the 16 columns' k pair p; columns past n zero.  Each
 * column's chunk rounds to 16 bf16 pairs in a register; a transpose of the
 * group's 16 makes the tile's rows (a scatter per column took most of a
 * short prompt's GEMM time). */
__attribute__((target(BF16_TARGET)))
static void pack_w(const sl_gemm_args *a, int c0, int cols, uint16_t *wb)
{
	const int k = a->k, nq = k / 32;
	for (int g = 0; g < cols / 16; g++)
		for (int q = 0; q < nq; q++) {
			__m512i v[16];
			for (int c = 0; c < 16; c++) {
				const int col = c0 + g * 16 + c;
				v[c] = _mm512_setzero_si512();
				if (col < a->n) {
					const sl_half *w = a->w + (size_t)col * k + (size_t)q * 32;
					const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)w));
					const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 16)));
					v[c] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
				}
			}
			transpose16(v);
			uint16_t *tile = wb + ((size_t)g * nq + q) * 512;
			for (int p = 0; p < 16; p++)
				_mm512_storeu_si512(tile + p * 32, v[p]);
		}
}

/* One 32 x 32 block: rows [r0, r0 + 32) of the padded x, the panel's
 * columns [g * 16, g * 16 + 32) (two groups), into out (32 x 32 fp32). */
__attribute__((target(AMX_TARGET)))
static void block(const uint16_t *xb, int k, const uint16_t *wb, int g, int r0, float *out)
{
	const int nq = k / 32;
	const size_t xs = (size_t)k * sizeof(uint16_t); /* bytes between x rows */
	_tile_zero(0);
	_tile_zero(1);
	_tile_zero(2);
	_tile_zero(3);
	const uint16_t *x0 = xb + (size_t)r0 * k, *x1 = x0 + (size_t)16 * k;
	const uint16_t *w0 = wb + (size_t)g * nq * 512, *w1 = w0 + (size_t)nq * 512;
	for (int q = 0; q < nq; q++) {
		_tile_loadd(4, x0 + q * 32, xs);
		_tile_loadd(5, x1 + q * 32, xs);
		_tile_loadd(6, w0 + (size_t)q * 512, 64);
		_tile_loadd(7, w1 + (size_t)q * 512, 64);
		_tile_dpbf16ps(0, 4, 6);
		_tile_dpbf16ps(1, 4, 7);
		_tile_dpbf16ps(2, 5, 6);
		_tile_dpbf16ps(3, 5, 7);
	}
	_tile_stored(0, out, 32 * sizeof(float));
	_tile_stored(1, out + 16, 32 * sizeof(float));
	_tile_stored(2, out + 16 * 32, 32 * sizeof(float));
	_tile_stored(3, out + 16 * 32 + 16, 32 * sizeof(float));
}

/* The same block with AVX512-BF16 dot products (VDPBF16PS: for each of 16
 * columns, the products of a k pair added to its fp32 sum): 8 rows at a
 * time, 16 accumulators (8 rows x the two groups); per k pair the two
 * groups' rows of the tile (the pair layout is what the instruction
 * reads) and each x row's pair broadcast.  Only the block's first rows
 * (rounded up to 8): a decode step's 5 to 8 rows are one pass, not four. */
__attribute__((target(BF16_TARGET)))
static void block_dp(const uint16_t *xb, int k, const uint16_t *wb, int g, int r0, int rows, float *out)
{
	const int nq = k / 32;
	const uint16_t *w0 = wb + (size_t)g * nq * 512, *w1 = w0 + (size_t)nq * 512;
	for (int rs = 0; rs < rows; rs += 8) {
		__m512 c0[8], c1[8];
		for (int i = 0; i < 8; i++)
			c0[i] = c1[i] = _mm512_setzero_ps();
		const uint16_t *x = xb + (size_t)(r0 + rs) * k;
		for (int q = 0; q < nq; q++)
			for (int p = 0; p < 16; p++) {
				const __m512bh a0 = (__m512bh)_mm512_loadu_si512(w0 + (size_t)q * 512 + p * 32);
				const __m512bh a1 = (__m512bh)_mm512_loadu_si512(w1 + (size_t)q * 512 + p * 32);
				const size_t kk = (size_t)q * 32 + 2 * (size_t)p;
				for (int i = 0; i < 8; i++) {
					uint32_t v;
					memcpy(&v, x + (size_t)i * k + kk, sizeof v);
					const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)v);
					c0[i] = _mm512_dpbf16_ps(c0[i], xv, a0);
					c1[i] = _mm512_dpbf16_ps(c1[i], xv, a1);
				}
			}
		for (int i = 0; i < 8; i++) {
			_mm512_storeu_ps(out + (rs + i) * 32, c0[i]);
			_mm512_storeu_ps(out + (rs + i) * 32 + 16, c1[i]);
		}
	}
}

__attribute__((target(AMX_TARGET)))
static void tiles_release(void)
{
	_tile_release();
}

/* The epilogue of a block's rows [r0, r0 + rows) and columns [n0, n0 + w)
 * from out (32 x 32), 16 columns at a time: the operations of
 * sl_cpu_epilogue in its order (+ bias, * alpha, ReLU with NaN and -0 to
 * +0, + the old y), so the same bits. */
__attribute__((target(BF16_TARGET)))
static void epilogue(const sl_gemm_args *a, const float *out, int r0, int rows, int n0, int w, float alpha)
{
	const bool relu = a->flags & SL_GEMM_RELU, accum = a->flags & SL_GEMM_ACCUM;
	const __m512 al = _mm512_set1_ps(alpha), zero = _mm512_setzero_ps();
	for (int j = 0; j < w; j += 16) {
		const __mmask16 mk = (__mmask16)(w - j >= 16 ? 0xffffu : (1u << (w - j)) - 1);
		const __m512 bias = a->bias ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, a->bias + n0 + j)) : zero;
		for (int r = 0; r < rows; r++) {
			float *y = a->y + (size_t)(r0 + r) * a->ldy + n0 + j;
			__m512 s = _mm512_loadu_ps(out + r * 32 + j);
			if (a->bias)
				s = _mm512_add_ps(s, bias);
			s = _mm512_mul_ps(s, al);
			if (relu)
				s = _mm512_max_ps(s, zero); /* NaN, -0: the second operand, +0 */
			if (accum)
				s = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, y), s);
			_mm512_mask_storeu_ps(y, mk, s);
		}
	}
}

__attribute__((target(BF16_TARGET)))
int sl_cpu_bf16_gemm(sl_backend *b, const sl_gemm_args *a, float alpha)
{
	sl_cpu_ctx *c = sl_cpu(b);
	const bool amx = c->gemm_bf16 == SL_CPU_GEMM_AMX;
	const int m = a->m, n = a->n, k = a->k, nt = c->nthreads;
	if (k % 32 || !a->w)
		return SL_EUNSUPPORTED; /* the caller's packed kernel instead */
	const int mp = (m + 31) & ~31;
	/* the x rows the blocks read: AMX's tiles all 32 of a block, the dot
	 * products the rows up to the next 8 */
	const int mx = amx ? mp : (m + 7) & ~7;
	/* a panel of up to 1 MiB of packed weights per thread, whole 32s */
	int np = (int)(AMX_PANEL_BYTES / ((size_t)k * sizeof(uint16_t))) & ~31;
	np = SL_MAX(32, SL_MIN(np, (n + 31) & ~31));
	const size_t xfl = ((size_t)mp * k + 1) / 2, wfl = (size_t)np * k / 2;
	SL_TRY(sl_cpu_grow(&c->gemm_c, &c->gemm_c_cap, xfl + (size_t)nt * (wfl + 32 * 32)));
	uint16_t *xb = (uint16_t *)c->gemm_c;
	float *tbase = c->gemm_c + xfl;
#pragma omp parallel for num_threads(nt) schedule(static)
	for (int r = 0; r < mx; r += 32)
		pack_x(a, xb, r, SL_MIN(r + 32, mx));
	const int npanels = (n + np - 1) / np;
#pragma omp parallel num_threads(nt)
	{
		const int id = omp_get_thread_num();
		uint16_t *wb = (uint16_t *)(tbase + (size_t)id * (wfl + 32 * 32));
		float *out = tbase + (size_t)id * (wfl + 32 * 32) + wfl;
		if (amx)
			tiles_config();
#pragma omp for schedule(dynamic, 1)
		for (int p = 0; p < npanels; p++) {
			const int c0 = p * np, cols = SL_MIN(np, (n - c0 + 31) & ~31);
			pack_w(a, c0, cols, wb);
			for (int r0 = 0; r0 < mp; r0 += 32)
				for (int g = 0; g < cols / 16; g += 2) {
					if (amx)
						block(xb, k, wb, g, r0, out);
					else
						block_dp(xb, k, wb, g, r0, SL_MIN(32, m - r0), out);
					const int n0 = c0 + g * 16;
					epilogue(a, out, r0, SL_MIN(32, m - r0), n0, SL_MIN(32, n - n0), alpha);
				}
		}
		if (amx)
			tiles_release();
	}
	return 0;
}

#else /* not x86-64 */

bool sl_cpu_bf16_available(char *why, size_t n)
{
	snprintf(why, n, "AVX512-BF16 is an x86-64 feature");
	return false;
}

bool sl_cpu_amx_available(char *why, size_t n)
{
	snprintf(why, n, "AMX is an x86-64 feature");
	return false;
}

int sl_cpu_bf16_gemm(sl_backend *b, const sl_gemm_args *a, float alpha)
{
	return SL_EUNSUPPORTED;
}
#endif
