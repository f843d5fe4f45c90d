/*
 * rope_freq.c - RoPE's inverse frequencies on the host (backend.h): the
 * table the rope op takes, from rope_theta and rope_scaling, so that the
 * kernels have one formula whatever the scaling.
 *
 * Hugging Face transformers computes the table with fp32 tensors, and the
 * angles a model sees are products with these values, so the arithmetic
 * below is fp32 in transformers' order: the exponent 2i / hd divided in
 * fp32; theta^e (here in double, then rounded: torch's fp32 pow may differ
 * by an ulp); a Python number divided by a tensor is the tensor's fp32
 * reciprocal times the number (torch's __rtruediv__), so 1 / p, 2 pi /
 * inv_freq and old_context / wavelen are written that way.  The llama3
 * thresholds compare fp32 wavelengths, as transformers does, so a
 * frequency on the boundary falls on the same side.
 * tests/test_ops.c checks the tables against values transformers computed
 * (tests/fixtures/rope-inv-freq.json, tools/make_rope_fixture.py).
 */
#include "backend.h"

#include <math.h>

static float recip_times(float x, double num)
{
	return (1.0f / x) * (float)num;
}

int sl_rope_inv_freq(int hd, double theta, const sl_rope_scaling *s, float *inv_freq)
{
	if (hd < 2 || hd > SL_ROPE_MAX_HD || hd % 2)
		return sl_err(SL_EINVAL, "rope: head_dim %d is not an even number from 2 to %d", hd,
			      SL_ROPE_MAX_HD);
	if (!(theta > 0.0) || !isfinite(theta))
		return sl_err(SL_EINVAL, "rope: rope_theta %g is not a positive number", theta);
	const sl_rope_type type = s ? s->type : SL_ROPE_DEFAULT;
	if (type != SL_ROPE_DEFAULT && type != SL_ROPE_LINEAR && type != SL_ROPE_LLAMA3)
		return sl_err(SL_EINVAL, "rope: unknown rope_scaling type %d", (int)type);
	if (type != SL_ROPE_DEFAULT && (!(s->factor > 0.0) || !isfinite(s->factor)))
		return sl_err(SL_EINVAL, "rope: rope_scaling factor %g is not a positive number",
			      s->factor);
	if (type == SL_ROPE_LLAMA3) {
		if (!(s->low_freq_factor > 0.0) || !(s->high_freq_factor > s->low_freq_factor) ||
		    !isfinite(s->high_freq_factor))
			return sl_err(SL_EINVAL,
				      "rope: llama3 rope_scaling needs 0 < low_freq_factor < "
				      "high_freq_factor (got %g and %g)",
				      s->low_freq_factor, s->high_freq_factor);
		if (s->original_max_position_embeddings <= 0)
			return sl_err(SL_EINVAL,
				      "rope: llama3 rope_scaling original_max_position_embeddings "
				      "%d is not positive",
				      s->original_max_position_embeddings);
	}

	const float base = (float)theta;
	for (int i = 0; i < hd / 2; i++) {
		const float e = (float)(2 * i) / (float)hd;
		const float p = (float)pow((double)base, (double)e);
		inv_freq[i] = 1.0f / p;
	}
	if (type == SL_ROPE_LINEAR) {
		for (int i = 0; i < hd / 2; i++)
			inv_freq[i] /= (float)s->factor;
	} else if (type == SL_ROPE_LLAMA3) {
		const double old_ctx = s->original_max_position_embeddings;
		const float low_wl = (float)(old_ctx / s->low_freq_factor);
		const float high_wl = (float)(old_ctx / s->high_freq_factor);
		const float factor = (float)s->factor;
		const float lo = (float)s->low_freq_factor;
		const float span = (float)(s->high_freq_factor - s->low_freq_factor);
		for (int i = 0; i < hd / 2; i++) {
			const float f = inv_freq[i];
			const float wl = recip_times(f, 2.0 * M_PI);
			if (wl > low_wl) {
				inv_freq[i] = f / factor; /* long wavelengths: interpolated */
			} else if (!(wl < high_wl)) {
				/* between the two: a smooth mix of scaled and kept */
				const float sm = (recip_times(wl, old_ctx) - lo) / span;
				inv_freq[i] = (1.0f - sm) * f / factor + sm * f;
			}
			/* short wavelengths: kept */
		}
	}
	return 0;
}

int sl_rope_check(const char *who, const sl_rope_args *a)
{
	if (a->rows < 0 || a->nh_q < 0 || a->nh_k < 0)
		return sl_err(SL_EINVAL, "%s: bad shape rows=%d nh_q=%d nh_k=%d", who, a->rows,
			      a->nh_q, a->nh_k);
	if (a->hd < 2 || a->hd > SL_ROPE_MAX_HD || a->hd % 2)
		return sl_err(SL_EINVAL, "%s: head dim %d is not an even number from 2 to %d", who,
			      a->hd, SL_ROPE_MAX_HD);
	if (a->rows == 0)
		return 0;
	if (a->nh_q > 0 && (!a->q || a->ldq < a->nh_q * a->hd))
		return sl_err(SL_EINVAL, "%s: q %s (ldq %d, %d heads of %d)", who,
			      a->q ? "rows too short" : "missing", a->ldq, a->nh_q, a->hd);
	if (a->k && a->nh_k > 0 && a->ldk < a->nh_k * a->hd)
		return sl_err(SL_EINVAL, "%s: k rows too short (ldk %d, %d heads of %d)", who, a->ldk,
			      a->nh_k, a->hd);
	if (!a->pos || !a->inv_freq)
		return sl_err(SL_EINVAL, "%s: no %s", who, a->pos ? "inverse frequencies" : "positions");
	for (int r = 0; r < a->rows; r++)
		if (a->pos[r] < 0)
			return sl_err(SL_EINVAL, "%s: row %d has position %d", who, r, (int)a->pos[r]);
	return 0;
}
