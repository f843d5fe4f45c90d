/*
 * cpu_llama.c - the ops the Llama family adds (backend_ops.def): RMSNorm,
 * rotary position embedding, SwiGLU.  Threads split the rows.  fp32
 * arithmetic in transformers' order, so that the products round as its
 * fp32 reference does; the RMS sum is accumulated in double (as the
 * layernorm's), which only makes it closer to the exact one.
 */
#include "cpu_internal.h"

#include <math.h>
#include <omp.h>

int sl_cpu_rmsnorm(sl_backend *b, sl_queue *q, int rows, int n, const float *x, int ldx,
		   const sl_half *gamma, float eps, float *y, int ldy)
{
	if (rows < 0 || n < 0 || ldx < n || ldy < n)
		return sl_err(SL_EINVAL, "cpu rmsnorm: bad shape rows=%d n=%d ldx=%d ldy=%d", rows, n,
			      ldx, ldy);
	if (rows == 0 || n == 0)
		return 0;
#pragma omp parallel for num_threads(sl_cpu(b)->nthreads) schedule(static)
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * ldx;
		float *yr = y + (size_t)r * ldy;
		double ss = 0.0;
		for (int i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		const float rstd = (float)(1.0 / sqrt(ss / n + (double)eps));
		for (int i = 0; i < n; i++)
			yr[i] = (xr[i] * rstd) * sl_half_to_float(gamma[i]);
	}
	return 0;
}

/* one head's row of hd values rotated by the angles of cs (c0 s0 c1 s1 ..) */
static void rotate(float *x, int half, const float *cs)
{
	for (int i = 0; i < half; i++) {
		const float x1 = x[i], x2 = x[i + half];
		const float c = cs[2 * i], s = cs[2 * i + 1];
		x[i] = x1 * c - x2 * s;
		x[i + half] = x2 * c + x1 * s;
	}
}

int sl_cpu_rope(sl_backend *b, sl_queue *q, const sl_rope_args *a)
{
	int rc = sl_rope_check("cpu rope", a);
	if (rc < 0 || a->rows == 0)
		return rc;
	const int half = a->hd / 2;
	const int nh_k = a->k ? a->nh_k : 0;
#pragma omp parallel num_threads(sl_cpu(b)->nthreads)
	{
		/* a row's cos and sin, shared by its heads */
		float cs[SL_ROPE_MAX_HD];
#pragma omp for schedule(static)
		for (int r = 0; r < a->rows; r++) {
			const float p = (float)a->pos[r];
			for (int i = 0; i < half; i++) {
				const float ang = p * a->inv_freq[i];
				cs[2 * i] = cosf(ang);
				cs[2 * i + 1] = sinf(ang);
			}
			for (int h = 0; h < a->nh_q; h++)
				rotate(a->q + (size_t)r * a->ldq + (size_t)h * a->hd, half, cs);
			for (int h = 0; h < nh_k; h++)
				rotate(a->k + (size_t)r * a->ldk + (size_t)h * a->hd, half, cs);
		}
	}
	return 0;
}

int sl_cpu_swiglu(sl_backend *b, sl_queue *q, int rows, int n, const float *gate, int ldg,
		  const float *up, int ldu, float *out, int ldo)
{
	if (rows < 0 || n < 0 || ldg < n || ldu < n || ldo < n)
		return sl_err(SL_EINVAL, "cpu swiglu: bad shape rows=%d n=%d ldg=%d ldu=%d ldo=%d",
			      rows, n, ldg, ldu, ldo);
	if (rows == 0 || n == 0)
		return 0;
#pragma omp parallel for num_threads(sl_cpu(b)->nthreads) schedule(static)
	for (int r = 0; r < rows; r++) {
		const float *g = gate + (size_t)r * ldg, *u = up + (size_t)r * ldu;
		float *o = out + (size_t)r * ldo;
		for (int i = 0; i < n; i++) {
			const float gi = g[i];
			o[i] = gi / (1.0f + expf(-gi)) * u[i];
		}
	}
	return 0;
}
