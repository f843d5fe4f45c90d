/*
 * cost.c - the cost model (cost.h says what it models).  docs/policy.md
 * gives the formulas with their terms; the names here follow it.
 */
#include "cost.h"
#include "sl_common.h"
#include "kv_tiers.h"
#include "profile_measure.h"
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *const sl_res_name[SL_NRES] = { "compute",   "cpu_attention", "h2d", "d2h",
					   "disk_read", "disk_write",    "zstd" };

#define PAGE 4096.0
#define DECODE_SAMPLES 64

/* Where the profile lacks a rate (a format 1 file), what the model
 * assumes: the GPU's memory bandwidth for its roofline, a queue's copy
 * and op latencies, the disk's write rate as a share of its read rate. */
#define FALLBACK_GPU_MEM_GBPS 2000.0
#define FALLBACK_COPY_LAT_US 5.0
#define FALLBACK_OP_LAT_US 5.0
#define FALLBACK_DISK_WRITE_SHARE 0.7
#define FALLBACK_ZSTD_GBPS 1.0
/* the frames a zstd store's segments are cut into (sluice convert --zstd):
 * each read and decompressed on its own */
#define ZSTD_FRAME_BYTES (4.0 * 1048576)

/* The rates of the profiled machine, in units per second. */
typedef struct rates {
	bool host;                 /* the device is host memory (CPU backend) */
	const sl_profile_curve *gemm;
	const sl_profile_curve *gemm_q4; /* 4-bit weights; the gemm curve where not measured */
	double peak_flops;         /* GEMM peak where no curve */
	double mem_bw;             /* the device memory's bandwidth (roofline) */
	double h2d, d2h;           /* bytes/s */
	double copy_lat, op_lat;   /* seconds */
	double attn_bw;            /* decode attention, cache bytes/s */
	double attn_pf_flops;      /* prefill attention FLOP/s */
	double cpu_attn_bw;        /* the host's decode attention, bytes/s */
	double disk_r, disk_w;     /* bytes/s; 0: no disk measured */
	const sl_profile_disk_curve *disk_seg; /* reads against the request size; NULL: disk_r */
	double disk_page;          /* the KV cache's page writes, bytes/s; 0: disk_w */
	double overlap;            /* CPU backend: the share of copies hidden under compute */
	double disk_overlap;       /* CPU backend: the share of the disk hidden under
				    * compute and copies (1 where not measured) */
	double zstd;               /* a zstd store's frames decompressed, raw bytes/s */
	const sl_profile_curve *shapes; /* the gemm curve at other n x k */
	int nshapes;
	const sl_profile_curve *gemm_hot; /* CPU backend: weights in the cache; NULL: none */
	double llc;                /* the bytes of weights the cache keeps (with gemm_hot) */
	bool hot_now;              /* this GEMM's weights are in the cache (gemm_hot) */
	int fit_hot_n;             /* --fit: the share of gemm_hot's gain a run's */
	const int *fit_hot_m;      /* micro-batches reach, at m rows (0 points: */
	const double *fit_hot_share; /* all of it); the profile's arrays */
	double fit_prefill, fit_decode; /* sluice profile --fit: the compute's
				    * measured over predicted, per phase (1: none) */
} rates;

static double pos_or(double v, double fallback)
{
	return v > 0 ? v : fallback;
}

static void rates_of(const sl_profile *p, bool host, rates *r)
{
	memset(r, 0, sizeof *r);
	r->host = host;
	r->gemm = p->gemm.npoints > 0 ? &p->gemm : NULL;
	/* a profile without the 4-bit curve (older files): the fp16 one, i.e.
	 * the dequantisation taken as free */
	r->gemm_q4 = p->gemm_q4.npoints > 0 ? &p->gemm_q4 : r->gemm;
	r->shapes = p->gemm_shapes;
	r->nshapes = r->gemm ? p->n_gemm_shapes : 0;
	/* the weights that stay in the cache: as measured, else hwloc's size */
	const uint64_t llc = p->llc_hot_bytes ? p->llc_hot_bytes : p->llc_bytes;
	const bool hot = host && r->gemm && p->gemm_hot.npoints > 0 && llc > 0;
	r->gemm_hot = hot ? &p->gemm_hot : NULL;
	r->llc = hot ? (double)llc : 0;
	const double mem = pos_or(p->mem_read_gbps, 10.0) * 1e9;
	if (host) {
		r->peak_flops = pos_or(p->cpu_gemm_gflops, 10.0) * 1e9;
		r->mem_bw = mem;
		r->h2d = r->d2h = pos_or(p->copy_gbps, mem / 1e9 / 2) * 1e9;
	} else {
		r->peak_flops = pos_or(p->gpu_gemm_tflops, 10.0) * 1e12;
		r->mem_bw = FALLBACK_GPU_MEM_GBPS * 1e9;
		r->h2d = pos_or(p->h2d_gbps, pos_or(p->copy_gbps, 10.0)) * 1e9;
		r->d2h = pos_or(p->d2h_gbps, r->h2d / 1e9) * 1e9;
	}
	r->copy_lat = pos_or(p->copy_latency_us, FALLBACK_COPY_LAT_US) * 1e-6;
	r->op_lat = pos_or(p->op_latency_us, FALLBACK_OP_LAT_US) * 1e-6;
	r->attn_bw = pos_or(p->attn_decode_gbps, r->mem_bw / 1e9) * 1e9;
	r->attn_pf_flops = pos_or(p->attn_prefill_gflops, r->peak_flops / 1e9 / 4) * 1e9;
	r->cpu_attn_bw = pos_or(p->cpu_attn_gbps, mem / 1e9) * 1e9;
	r->disk_r = p->disk_read_gbps * 1e9;
	r->disk_w = pos_or(p->disk_write_gbps, p->disk_read_gbps * FALLBACK_DISK_WRITE_SHARE) * 1e9;
	r->disk_seg = p->disk_seg.npoints > 0 ? &p->disk_seg : NULL;
	r->disk_page = p->disk_page_write_gbps * 1e9;
	r->overlap = host ? p->copy_overlap : 0;
	r->disk_overlap = host && p->have_disk_overlap ? p->disk_overlap : 1;
	r->zstd = pos_or(p->zstd_gbps, FALLBACK_ZSTD_GBPS) * 1e9;
	r->fit_prefill = pos_or(p->fit_prefill, 1);
	r->fit_decode = pos_or(p->fit_decode, 1);
	r->fit_hot_n = SL_MIN(p->fit_hot_n, SL_PROFILE_FIT_HOT_MAX);
	r->fit_hot_m = p->fit_hot_m;
	r->fit_hot_share = p->fit_hot_share;
}

/* The value at x on the line from (x0, y0) to (x1, y1) in log x: every
 * profile curve is interpolated so (the rates themselves in log too, by
 * passing their logs). */
static double lerp_log_x(double x, double x0, double x1, double y0, double y1)
{
	return y0 + (y1 - y0) * ((log(x) - log(x0)) / (log(x1) - log(x0)));
}

/* The share of the hot curve's gain a run's micro-batches reach at m rows
 * (--fit's fit_hot): between its points interpolated in log m, beyond them
 * the nearest; all of it where not fitted. */
static double hot_share(const rates *r, double m)
{
	const int np = r->fit_hot_n;
	if (np <= 0)
		return 1;
	if (m <= r->fit_hot_m[0])
		return r->fit_hot_share[0];
	if (m >= r->fit_hot_m[np - 1])
		return r->fit_hot_share[np - 1];
	int i = 0;
	while (i + 1 < np && r->fit_hot_m[i + 1] < m)
		i++;
	return lerp_log_x(m, r->fit_hot_m[i], r->fit_hot_m[i + 1], r->fit_hot_share[i], r->fit_hot_share[i + 1]);
}

/* GB/s of the disk's reads in requests of req bytes: the profile's segment
 * curve interpolated log-log between its points, the end points' rates
 * beyond them. */
static double disk_seg_gbps(const sl_profile_disk_curve *c, double req)
{
	const int np = c->npoints;
	if (req <= (double)c->bytes[0])
		return c->gbps[0];
	if (req >= (double)c->bytes[np - 1])
		return c->gbps[np - 1];
	int i = 0;
	while (i + 1 < np && (double)c->bytes[i + 1] < req)
		i++;
	return exp(lerp_log_x(req, (double)c->bytes[i], (double)c->bytes[i + 1], log(c->gbps[i]), log(c->gbps[i + 1])));
}

/* GFLOP/s of the profiled GEMM at m rows: the curve interpolated in log-log
 * between its points; below its first point the time of the first point's
 * (a GEMM of few rows reads its weights whatever m: the rate falls with
 * m); above its last, the last rate.  No curve: a roofline of the peak and
 * the memory bandwidth over the weight, input and output bytes.  q4: 4-bit
 * weights (compress_weight), the gemm_q4 curve (rates_of's fallback), the
 * roofline over their 36 bytes per 64 values. */
/* A curve's GFLOP/s at m (see gemm_seconds_w). */
static double curve_gflops(const sl_profile_curve *c, double m)
{
	const int np = c->npoints;
	if (m <= c->m[0])
		return c->gflops[0] * m / c->m[0];
	if (m >= c->m[np - 1])
		return c->gflops[np - 1];
	int i = 0;
	while (i + 1 < np && c->m[i + 1] < m)
		i++;
	return exp(lerp_log_x(m, c->m[i], c->m[i + 1], log(c->gflops[i]), log(c->gflops[i + 1])));
}

/* A shape curve's rate against the gemm curve's at m: at its points their
 * ratio, between them interpolated in log m, beyond them the nearest. */
static double shape_ratio(const sl_profile_curve *s, const sl_profile_curve *g, double m)
{
	const int np = s->npoints;
	int i = 0;
	while (i + 1 < np && s->m[i + 1] < m)
		i++;
	const double r0 = s->gflops[i] / curve_gflops(g, s->m[i]);
	if (m <= s->m[0] || i + 1 >= np)
		return r0;
	const double r1 = s->gflops[i + 1] / curve_gflops(g, s->m[i + 1]);
	return exp(lerp_log_x(m, s->m[i], s->m[i + 1], log(r0), log(r1)));
}

static double gemm_seconds_w(const rates *r, bool q4, double m, double n, double k)
{
	const double flop = 2 * m * n * k;
	if (m <= 0)
		return 0;
	const sl_profile_curve *c = q4 ? r->gemm_q4 : r->gemm;
	if (!c) {
		const double wbytes = q4 ? n * ceil(k / SL_Q4_GROUP) * (SL_Q4_CODE_BYTES + SL_Q4_META_BYTES)
					 : 2 * n * k;
		const double bytes = wbytes + 4 * m * k + 4 * m * n;
		return fmax(flop / r->peak_flops, bytes / r->mem_bw);
	}
	/* measured at this very shape (fp16 weights): the curve scaled by
	 * the shape's ratio to it */
	double ratio = 1;
	for (int i = 0; !q4 && i < r->nshapes; i++)
		if (r->shapes[i].npoints > 0 && r->shapes[i].n == (int)n && r->shapes[i].k == (int)k) {
			ratio = shape_ratio(&r->shapes[i], r->gemm, m);
			break;
		}
	double g = curve_gflops(c, m) * ratio;
	/* weights in the cache (r->hot_now): the hot curve, by the same
	 * ratio, or the share of its gain that --fit found runs reach; never
	 * slower than from memory */
	if (r->hot_now && !q4) {
		const double gh = curve_gflops(r->gemm_hot, m) * ratio;
		if (gh > g)
			g += hot_share(r, m) * (gh - g);
	}
	return flop / (g * 1e9);
}

static int add_shape(int shapes[][2], int count, int max, double n, double k)
{
	for (int i = 0; i < count; i++)
		if (shapes[i][0] == (int)n && shapes[i][1] == (int)k)
			return count;
	if (count < max) {
		shapes[count][0] = (int)n;
		shapes[count][1] = (int)k;
		count++;
	}
	return count;
}

int sl_cost_profile_shapes(struct sl_profile_opts *o, const sl_model_config *c)
{
	int sh[SL_PROFILE_SHAPES_MAX][2];
	const int n = sl_cost_gemm_shapes(c, sh, SL_PROFILE_SHAPES_MAX);
	for (int i = 0; i < n; i++)
		SL_TRY(sl_profile_add_shape(o, sh[i][0], sh[i][1]));
	return 0;
}

int sl_cost_gemm_shapes(const sl_model_config *c, int shapes[][2], int max)
{
	const double h = c->hidden, f = c->ffn, e = c->embed_dim;
	int k = 0;
	if (c->family == SL_FAMILY_LLAMA) {
		const double qd = sl_model_q_dim(c), kvd = sl_model_kv_dim(c);
		k = add_shape(shapes, k, max, qd, h);
		k = add_shape(shapes, k, max, kvd, h);
		k = add_shape(shapes, k, max, h, qd);
	} else {
		k = add_shape(shapes, k, max, h, h);
	}
	k = add_shape(shapes, k, max, f, h);
	k = add_shape(shapes, k, max, h, f);
	k = add_shape(shapes, k, max, c->vocab, e);
	if (c->embed_dim != c->hidden)
		k = add_shape(shapes, k, max, e, h);
	return k;
}

static double gemm_seconds(const rates *r, double m, double n, double k)
{
	return gemm_seconds_w(r, false, m, n, k);
}

/* Busy seconds and work of each resource (a layer, a step, a phase). */
typedef struct acc {
	double busy[SL_NRES], work[SL_NRES];
} acc;

static void add(acc *a, int res, double work, double seconds)
{
	a->work[res] += work;
	a->busy[res] += seconds;
}

static void copy(acc *a, const rates *r, bool h2d, double bytes, double copies)
{
	if (bytes <= 0)
		return;
	add(a, h2d ? SL_RES_H2D : SL_RES_D2H, bytes, bytes / (h2d ? r->h2d : r->d2h) + copies * r->copy_lat);
}

/* The disk's transfers by kind: a segment read (a weight unit, a
 * micro-batch's cache) or written whole (the prefill's cache), and the
 * KV cache's changed pages. */
enum { SEG_READ, SEG_WRITE, PAGE_WRITE };

/*
 * requests transfers of bytes in all: segment reads at the profile's
 * curve's rate at their size (bytes / requests), page writes at its page
 * rate; where the profile lacks them (and for segment writes) bytes at the
 * sequential rate plus a copy latency per request.
 */
static void disk(acc *a, const rates *r, int kind, double bytes, double requests)
{
	if (bytes <= 0)
		return;
	double sec;
	if (kind == SEG_READ && r->disk_seg) {
		sec = bytes / (disk_seg_gbps(r->disk_seg, bytes / fmax(requests, 1)) * 1e9);
	} else if (kind == PAGE_WRITE && r->disk_page > 0) {
		sec = bytes / r->disk_page;
	} else {
		const double rate = kind == SEG_READ ? r->disk_r : r->disk_w;
		sec = (rate > 0 ? bytes / rate : 0) + requests * r->copy_lat;
	}
	add(a, kind == SEG_READ ? SL_RES_DISK_READ : SL_RES_DISK_WRITE, bytes, sec);
}

static void acc_sum(acc *dst, const acc *src, double times)
{
	for (int i = 0; i < SL_NRES; i++) {
		dst->busy[i] += src->busy[i] * times;
		dst->work[i] += src->work[i] * times;
	}
}

/*
 * The wall time of work a, done in one schedule step: with overlap, the
 * busiest chain; without, every resource in turn.  The chains: on the CPU
 * backend compute and the copies share the cores (one chain, less the
 * profile's measured share of the shorter that hides under the longer:
 * copy_overlap) and the disk reads and writes share the disk, beside them
 * less the measured share of the shorter (disk_overlap; where not
 * measured, the longer of the two); on a GPU compute and cpu_cache_compute's
 * attention are one chain (the compute queue waits for the host's
 * attention), each copy direction is one, and the disk is one.
 */
static double wall(const acc *a, const rates *r, bool overlap)
{
	const double *b = a->busy;
	const double disk = b[SL_RES_DISK_READ] + b[SL_RES_DISK_WRITE];
	if (!overlap) {
		double s = 0;
		for (int i = 0; i < SL_NRES; i++)
			s += b[i];
		return s;
	}
	if (r->host) {
		const double comp = b[SL_RES_COMPUTE] + b[SL_RES_CPU_ATTN] + b[SL_RES_ZSTD],
			     copies = b[SL_RES_H2D] + b[SL_RES_D2H];
		const double x = comp + copies - r->overlap * fmin(comp, copies);
		/* the disk beside them, less the share of the shorter that
		 * hides (all of it where not measured: max(x, disk)) */
		return x + disk - r->disk_overlap * fmin(x, disk);
	}
	return fmax(fmax(fmax(b[SL_RES_COMPUTE] + b[SL_RES_CPU_ATTN], disk), fmax(b[SL_RES_H2D], b[SL_RES_D2H])),
		    b[SL_RES_ZSTD]);
}

/* The model's shapes and the plan's split, as the cost model reads them. */
typedef struct shape {
	const sl_model_config *c;
	const sl_plan *pl;
	double h, f, nh, es;   /* hidden, ffn, KV heads, cache element bytes */
	double qd, kvd;        /* query and key/value row widths (OPT: both h) */
	bool swiglu;           /* the LLaMA family's MLP: gate, up and down */
	double slot;           /* one token's K (or V) row of every head: h x es, or
				* its 4-bit form (sl_plan_kv_slot_bytes) */
	double ss;             /* H2O: a sequence's scores (or positions) of one layer */
	double w_host, w_disk; /* one layer's streamed weight bytes */
	double w_layer;        /* one layer's weight bytes, wherever they live */
	double w_zstd;         /* the disk share's zstd ratio; 0: a plain store */
	int units;             /* weight units a layer loads in (2 with sep_layer halves) */
	double w_mlp;          /* the MLP's share of a layer's weight bytes */
	bool ccc;              /* cpu_cache_compute in effect */
	int heavy_recent;      /* H2O: tokens the cache keeps after a step */
} shape;

/* The weights layer l streams in one forward.  Where the device is host
 * memory the host tier is read in place (sl_weight_place.host_in_place):
 * no copy, its bytes are the GEMMs' own reads. */
static void layer_weights(acc *a, const shape *s, const rates *r)
{
	if (s->w_host > 0 && !r->host)
		copy(a, r, true, s->w_host, s->units);
	if (s->w_disk > 0 && s->w_zstd > 0) {
		/* a zstd store: the frames' pages, a read each, then the
		 * host's threads decompress them */
		const double frames = fmax(s->units, ceil(s->w_disk / ZSTD_FRAME_BYTES));
		disk(a, r, SEG_READ, s->w_disk * s->w_zstd, frames);
		add(a, SL_RES_ZSTD, s->w_disk, s->w_disk / r->zstd);
	} else if (s->w_disk > 0) {
		disk(a, r, SEG_READ, s->w_disk, s->units);
	}
	if (s->w_disk > 0 && !r->host)
		copy(a, r, true, s->w_disk, s->units);
}

static double pages(double bytes)
{
	return ceil(bytes / PAGE) * PAGE;
}

/*
 * The bytes a decode step writes to the disk part of a micro-batch of gd
 * sequences (their segment: every K block, every V block, then H2O's
 * scores and positions): whole pages holding the changed bytes, each page
 * once.  Dense: the new token's row of each K and V block, at slot len,
 * counted exactly for up to EXACT_SEQS sequences (the blocks are walked in
 * order), else as one page a row with the blocks' pages as the bound.
 * H2O: the new row's heads land in evicted slots, anywhere in a block (at
 * most a page a head), and the scores and positions are written whole;
 * never more than the segment.
 */
#define EXACT_SEQS 256
static double write_pages(const shape *s, const sl_plan *pl, int gd, double len)
{
	const double sb = (double)pl->cap * s->slot;
	const double seg = pages(gd * 2.0 * (sb + s->ss)) / PAGE;
	double n;
	if (pl->h2o) {
		const double per_block = fmin(s->nh, ceil(sb / PAGE) + 1);
		n = 2 * fmin(gd * per_block, ceil(gd * sb / PAGE) + 1) + ceil(gd * 2 * s->ss / PAGE) + 1;
	} else if (gd <= EXACT_SEQS) {
		n = 0;
		double last = -1;
		for (int v = 0; v < 2; v++)
			for (int j = 0; j < gd; j++) {
				const double off = ((double)v * gd + j) * sb + len * s->slot;
				const double p0 = floor(off / PAGE), p1 = floor((off + s->slot - 1) / PAGE);
				n += p1 - fmax(p0, last + 1) + 1;
				last = p1;
			}
	} else {
		n = fmin(2.0 * gd * (1 + floor((s->slot - 1) / PAGE) + 1), 2 * ceil(gd * sb / PAGE));
	}
	return fmin(n, seg) * PAGE;
}

/*
 * The bytes a decode step reads of the disk part of a micro-batch of gd
 * sequences holding len rows each (sl_kvt_load_disk): of every K and V
 * block the pages holding its first len rows, the scores and positions
 * whole, ranges that touch read together (*reads: how many reads).
 * Counted exactly for up to EXACT_SEQS sequences, else each block's own
 * pages.
 */
static double read_pages(const shape *s, const sl_plan *pl, int gd, double len, double *reads)
{
	const double sb = (double)pl->cap * s->slot, fill = fmin(len, pl->cap) * s->slot;
	const double state = 2.0 * gd * s->ss;
	double n = 0, nr = 0;
	if (gd > EXACT_SEQS) {
		const double per = fill > 0 ? ceil(fill / PAGE) + 1 : 0;
		n = fmin(2.0 * gd * per, ceil(2.0 * gd * sb / PAGE)) + (state > 0 ? ceil(state / PAGE) + 1 : 0);
		*reads = (fill > 0 ? 2.0 * gd : 0) + (state > 0);
		return fmin(n, ceil(2.0 * gd * (sb + s->ss) / PAGE)) * PAGE;
	}
	double last = -1; /* the last page read */
	for (int b = 0; b <= 2 * gd; b++) {
		/* the K and V blocks in order, then the state blocks */
		const double off = b * sb, nb = b < 2 * gd ? fill : state;
		if (nb <= 0)
			continue;
		const double p0 = floor(off / PAGE), p1 = floor((off + nb - 1) / PAGE);
		if (last < 0 || p0 > last + 1)
			nr++; /* the first, or after a gap: a new read */
		n += p1 - fmax(p0, last + 1) + 1;
		last = fmax(last, p1);
	}
	*reads = nr;
	return n * PAGE;
}

/*
 * One micro-batch of g sequences at one layer: its compute, its cache's
 * movement, its activation rows.  t: tokens per sequence this forward (the
 * prompt, or 1); len: the tokens each sequence's cache holds before a
 * decode step (0 in the prefill).
 */
static void micro_batch(acc *a, const shape *s, const rates *r, int g, int t, double len, bool prefill,
			bool rows_move, double *mlp_s)
{
	const sl_plan *pl = s->pl;
	const double rows = (double)g * t, h = s->h, f = s->f;
	const sl_kvt_split sp = sl_kvt_split_of(g, pl->p.cache_gpu, pl->p.cache_cpu);
	const int gh = sp.host, gd = sp.disk;
	const bool h2o = pl->h2o;
	/* GEMMs: q, k, v, out (h x h), fc1 (f x h), fc2 (h x f); the LLaMA
	 * family: q (qd x h), k and v (kvd x h), out (h x qd), gate and up (f
	 * x h), down (h x f) */
	const double qd = s->qd, kvd = s->kvd;
	double sec, flop;
	int nops;
	const bool wq = pl->p.w_q4;
	/* the MLP half's GEMMs */
	const double mlp = (s->swiglu ? 2 : 1) * gemm_seconds_w(r, wq, rows, f, h) + gemm_seconds_w(r, wq, rows, h, f);
	if (!s->swiglu) {
		sec = 4 * gemm_seconds_w(r, wq, rows, h, h) + mlp;
		flop = 2 * rows * (4 * h * h + 2 * h * f);
		nops = 8; /* two norms, six GEMMs */
	} else {
		sec = gemm_seconds_w(r, wq, rows, qd, h) + 2 * gemm_seconds_w(r, wq, rows, kvd, h) +
		      gemm_seconds_w(r, wq, rows, h, qd) + mlp;
		flop = 2 * rows * (2 * h * qd + 2 * h * kvd + 3 * h * f);
		nops = 11; /* two norms, seven GEMMs, the rotation, SwiGLU */
	}
	/* the attention of each part (H2O: and its compaction or eviction) */
	const int nparts = (sp.dev > 0) + (gh > 0) + (gd > 0);
	sec += (nops + nparts * (h2o ? 2 : 1)) * r->op_lat;
	if (prefill) {
		/* every query head's scores and weighted sum */
		const double af = 4.0 * g * qd * t * (t + 1) / 2;
		flop += af;
		sec += af / r->attn_pf_flops;
	} else {
		/* the device reads every part's cache but the host's under
		 * cpu_cache_compute on a GPU; the new token's row too */
		const bool host_attn = s->ccc && !r->host && gh > 0;
		const int gdev = host_attn ? g - gh : g;
		const double bytes = 2.0 * gdev * (len + 1) * s->slot;
		flop += 4.0 * gdev * qd * (len + 1);
		sec += bytes / r->attn_bw;
		if (host_attn) {
			const double hb = 2.0 * gh * (len + 1) * s->slot;
			add(a, SL_RES_CPU_ATTN, hb, hb / r->cpu_attn_bw + 2 * r->op_lat);
			/* q, k, v rows out, the attention's rows back */
			copy(a, r, false, (qd + 2 * kvd) * gh * 4, 3);
			copy(a, r, true, (double)gh * qd * 4, 1);
		}
	}
	const double fit = prefill ? r->fit_prefill : r->fit_decode;
	add(a, SL_RES_COMPUTE, flop, sec * fit);
	/* of which the MLP half's: its GEMMs and its norm (and SwiGLU) */
	*mlp_s += fit * (mlp + (s->swiglu ? 2 : 1) * r->op_lat);
	/* the host part of the cache (cpu_cache_compute: used where it lives,
	 * the CPU backend's attention reading it in place) */
	if (gh > 0 && !(s->ccc && !prefill)) {
		if (prefill) {
			/* the prompt's rows (H2O: the kept ones) and the state */
			const double kept = h2o ? fmin(t, s->heavy_recent) : t;
			copy(a, r, false, 2.0 * gh * kept * s->slot + (h2o ? 2.0 * gh * s->ss : 0),
			     2.0 * gh + (h2o ? 2 : 0));
		} else {
			copy(a, r, true, 2.0 * gh * len * s->slot + (h2o ? 2.0 * gh * s->ss : 0),
			     2.0 * gh + (h2o ? 2 : 0));
			copy(a, r, false, 2.0 * gh * s->slot + (h2o ? 2.0 * gh * s->ss : 0),
			     2.0 * gh + (h2o ? 2 : 0));
		}
	}
	/* H2O on a GPU: a decode step reads back the positions of the parts
	 * off the device, to know which rows changed */
	if (h2o && !prefill && !r->host) {
		const int back = (s->ccc ? 0 : gh) + gd;
		if (back > 0)
			copy(a, r, false, back * s->ss, 1);
	}
	/* the disk part: the micro-batch's segment written whole by the
	 * prefill; a decode step reads its rows in use and writes the changed
	 * pages (on a GPU, from the device through the bounce) */
	if (gd > 0) {
		const double unit = 2.0 * ((double)pl->cap * s->slot + s->ss);
		const double seg = pages(gd * unit);
		if (prefill) {
			if (!r->host)
				copy(a, r, false, seg, 1);
			disk(a, r, SEG_WRITE, seg, 1);
		} else {
			double reads;
			const double rd = read_pages(s, pl, gd, len, &reads);
			disk(a, r, SEG_READ, rd, reads);
			if (!r->host)
				copy(a, r, true, rd, reads);
			const double wr = write_pages(s, pl, gd, len);
			if (!r->host)
				copy(a, r, false, wr, 2.0 * gd);
			disk(a, r, PAGE_WRITE, wr, 2.0 * gd + (h2o ? 2 : 0));
		}
	}
	/* the residual rows on the host: in and out of the device */
	if (rows_move) {
		copy(a, r, true, rows * h * 4, 1);
		copy(a, r, false, rows * h * 4, 1);
	}
}

/*
 * One layer's wall seconds: its micro-batches' work (layer, of which
 * mlp_s the MLP halves' compute) and its weights' loads (w).  With overlap
 * each layer's loads hide under the one before it; by sep_layer halves
 * (wstage.c: a slot for each) the MLP's load hides only under the
 * attention's compute (with the rest of the layer's I/O), the next
 * attention's under the MLP's.
 */
static double layer_wall(const acc *layer, const acc *w, double mlp_s, const shape *s, const rates *r, bool overlap)
{
	if (!(overlap && s->units == 2)) {
		acc all = *layer;
		acc_sum(&all, w, 1);
		return wall(&all, r, overlap);
	}
	acc attn = *layer, mlp = { 0 };
	const double cf = layer->busy[SL_RES_COMPUTE] > 0 ? mlp_s / layer->busy[SL_RES_COMPUTE] : 0;
	add(&mlp, SL_RES_COMPUTE, layer->work[SL_RES_COMPUTE] * cf, mlp_s);
	attn.busy[SL_RES_COMPUTE] -= mlp_s;
	attn.work[SL_RES_COMPUTE] -= mlp.work[SL_RES_COMPUTE];
	acc_sum(&attn, w, s->w_mlp);
	acc_sum(&mlp, w, 1 - s->w_mlp);
	return wall(&attn, r, true) + wall(&mlp, r, true);
}

/*
 * One forward (the prefill, t = the prompt; a decode step, t = 1, len
 * cached tokens) of the whole block, into phase ph.
 */
static void forward(sl_cost_phase *ph, const shape *s, const rates *r, int t, double len, bool prefill)
{
	const sl_plan *pl = s->pl;
	const sl_model_config *c = s->c;
	const int nseq = pl->p.max_seq, gs = pl->gs;
	const int nmb = (nseq + gs - 1) / gs, last = nseq - (nmb - 1) * gs;
	const bool overlap = pl->p.overlap;
	/* act_host: the residual rows live on the host.  With several
	 * micro-batches each step brings its rows in and sends them back (with
	 * sep_layer twice a layer: the attention's steps, then the MLP's); with
	 * one they stay in the step buffer through the layers (sl_rstage keeps
	 * them while the next step works on the same rows): in once, out once */
	const bool act = pl->p.act_host;
	const bool rows_move = act && nmb > 1;
	const int row_moves = pl->p.sep_layer && rows_move ? 2 : 1;
	const double all_rows = (double)nseq * t * s->h * 4;
	/* CPU backend: a layer's micro-batches after its first read the
	 * weights the one before just read, from the last-level cache where
	 * the layer's weights fit it (gemm_hot) */
	rates rh = *r;
	rh.hot_now = r->gemm_hot && s->w_layer <= r->llc;
	acc layer = { 0 };
	double mlp_s = 0, one_s = 0; /* the MLP halves' compute seconds */
	if (nmb > 1) {
		acc first = { 0 }, mb = { 0 };
		micro_batch(&first, s, r, gs, t, len, prefill, false, &mlp_s);
		acc_sum(&layer, &first, 1);
		micro_batch(&mb, s, &rh, gs, t, len, prefill, false, &one_s);
		acc_sum(&layer, &mb, nmb - 2);
		mlp_s += one_s * (nmb - 2);
	}
	acc mlast = { 0 };
	micro_batch(&mlast, s, nmb > 1 ? &rh : r, last, t, len, prefill, false, &mlp_s);
	acc_sum(&layer, &mlast, 1);
	if (rows_move) {
		copy(&layer, r, true, all_rows * row_moves, nmb * row_moves);
		copy(&layer, r, false, all_rows * row_moves, nmb * row_moves);
	}
	acc w = { 0 };
	layer_weights(&w, s, r);
	/* every layer alike, but the first layer's loads are waited for */
	const double n_layer = c->n_layer;
	double sec = n_layer * layer_wall(&layer, &w, mlp_s, s, r, overlap);
	acc_sum(&layer, &w, 1);
	if (overlap)
		sec += wall(&w, r, false);
	acc all = { 0 };
	acc_sum(&all, &layer, n_layer);
	/* the head over each sequence's last row, the embedding, the final
	 * norm, the sampling's sync; act_host: the rows in and out once */
	acc head = { 0 };
	const double e = c->embed_dim;
	add(&head, SL_RES_COMPUTE, 2.0 * nseq * e * c->vocab,
	    (gemm_seconds(r, nseq, c->vocab, e) + (c->embed_dim != c->hidden ? gemm_seconds(r, nseq, e, s->h) : 0) +
	     6 * r->op_lat) * (prefill ? r->fit_prefill : r->fit_decode));
	if (act) {
		/* the embedding's rows out to the host; the head's rows in */
		copy(&head, r, false, all_rows, 1);
		copy(&head, r, true, (double)nseq * s->h * 4, 1);
		if (!rows_move) {
			copy(&head, r, true, all_rows, 1);
			copy(&head, r, false, all_rows, 1);
		}
	}
	sec += wall(&head, r, false);
	acc_sum(&all, &head, 1);
	ph->seconds += sec;
	for (int i = 0; i < SL_NRES; i++) {
		ph->busy[i] += all.busy[i];
		ph->work[i] += all.work[i];
	}
}

static int bottleneck(const sl_cost_phase *ph)
{
	int best = 0;
	for (int i = 1; i < SL_NRES; i++)
		if (ph->busy[i] > ph->busy[best])
			best = i;
	return best;
}

int sl_cost_eval(const sl_model_config *c, const sl_plan *pl, const sl_profile *prof, int prompt_len,
		 int gen_len, sl_cost *out)
{
	memset(out, 0, sizeof *out);
	const sl_plan_params *p = &pl->p;
	if (p->max_seq <= 0)
		return sl_err(SL_EINVAL, "the cost model needs a run plan with a workload");
	if (prompt_len <= 0 || gen_len <= 0 || prompt_len > p->max_prompt ||
	    prompt_len + gen_len > p->max_len)
		return sl_err(SL_EINVAL, "a job of %d prompt tokens and %d new ones is outside the run plan's workload (%d, %d in all)",
			      prompt_len, gen_len, p->max_prompt, p->max_len);
	rates r;
	rates_of(prof, pl->dev_is_host, &r);
	shape s = { .c = c, .pl = pl, .h = c->hidden, .f = c->ffn, .nh = c->n_kv_head,
		    .qd = sl_model_q_dim(c), .kvd = sl_model_kv_dim(c),
		    .swiglu = c->family == SL_FAMILY_LLAMA };
	s.es = p->kv_f32 ? 4 : 2;
	s.slot = (double)sl_plan_kv_slot_bytes(c, p); /* h x es, or compressed */
	s.ss = pl->h2o ? (double)c->n_kv_head * pl->cap * 4 : 0;
	size_t wd, wh, wk;
	sl_weights_layer_split(c, p->w_gpu, p->w_cpu, p->w_q4, &wd, &wh, &wk);
	s.w_host = (double)wh;
	s.w_disk = (double)wk;
	s.w_layer = (double)(wd + wh + wk);
	s.w_zstd = p->w_zstd;
	s.units = p->sep_layer && (wk + (pl->dev_is_host ? 0 : wh)) > 0 ? 2 : 1;
	{
		const double qd = s.qd, kvd = s.kvd, h = s.h, f = s.f;
		const double attn_w = 2 * h * qd + 2 * h * kvd, mlp_w = (s.swiglu ? 3 : 2) * h * f;
		s.w_mlp = mlp_w / (attn_w + mlp_w);
	}
	s.ccc = p->cpu_cache_compute;
	s.heavy_recent = pl->h2o ? pl->cap - 1 : prompt_len + gen_len;

	out->batch = p->max_seq;
	out->prompt_len = prompt_len;
	out->gen_len = gen_len;
	forward(&out->prefill, &s, &r, prompt_len, 0, true);
	/* the decode steps: every one up to DECODE_SAMPLES, else that many
	 * evenly spaced, each standing for its share (a step's time is a
	 * maximum of terms linear in the cached tokens: smooth in the step) */
	const int steps = gen_len - 1;
	const int ns = steps <= DECODE_SAMPLES ? steps : DECODE_SAMPLES;
	for (int j = 0; j < ns; j++) {
		const int i = ns == steps ? j + 1 : 1 + (int)((j + 0.5) * steps / ns);
		/* the tokens cached before step i: the prompt and i - 1 new ones,
		 * under H2O at most its budget */
		double len = prompt_len + i - 1;
		if (pl->h2o)
			len = fmin(len, s.heavy_recent);
		sl_cost_phase one = { 0 };
		forward(&one, &s, &r, 1, len, false);
		const double wgt = (double)steps / ns;
		out->decode.seconds += one.seconds * wgt;
		for (int k = 0; k < SL_NRES; k++) {
			out->decode.busy[k] += one.busy[k] * wgt;
			out->decode.work[k] += one.work[k] * wgt;
		}
	}
	out->prefill.bottleneck = bottleneck(&out->prefill);
	out->decode.bottleneck = bottleneck(&out->decode);
	out->seconds = out->prefill.seconds + out->decode.seconds;
	out->tok_s = out->seconds > 0 ? (double)out->batch * gen_len / out->seconds : 0;
	out->peak = pl->total;
	if (!pl->dev_is_host)
		out->peak.device += prof->dev_reserve_bytes;
	return 0;
}

static void fmt_size(double n, char *buf, size_t len)
{
	if (n >= 1073741824.0)
		snprintf(buf, len, "%.2fG", n / 1073741824.0);
	else if (n >= 1048576.0)
		snprintf(buf, len, "%.1fM", n / 1048576.0);
	else
		snprintf(buf, len, "%.0fK", n / 1024.0);
}

int sl_cost_fits(const sl_tier_bytes *peak, const sl_budgets *b, int *tier)
{
	static const char *const names[3] = { "device", "host", "disk" };
	const size_t need[3] = { peak->device, peak->host, peak->disk };
	const size_t have[3] = { b->device, b->host, b->disk };
	for (int i = 0; i < 3; i++) {
		if (!have[i] || need[i] <= have[i])
			continue;
		if (tier)
			*tier = i;
		char a[32], h[32], o[32];
		fmt_size((double)need[i], a, sizeof a);
		fmt_size((double)have[i], h, sizeof h);
		fmt_size((double)(need[i] - have[i]), o, sizeof o);
		return sl_err(SL_EBUDGET, "%s: needs %s, the budget is %s (%s over)", names[i], a, h, o);
	}
	return 0;
}
