/*
 * backend.h - the one compute interface the engine calls.
 *
 * A backend is a table of function pointers plus a context pointer (the
 * ggml backend / vmaf extractor pattern).  There is one table per kind of
 * hardware: the CPU backend (kernels/cpu) is the reference and a real mode
 * for machines without a GPU; the CUDA backend (kernels/cuda) is the fast
 * one.  Every op of one has a twin in the other with the same meaning, and
 * tests/test_cross_backend.c compares them on random inputs.  The calls
 * (queues, events, copies, ops) are written once, with their documentation,
 * in backend_ops.def; callers issue them through the wrappers at the end of
 * this file, sl_<call>(b, ...).
 *
 * Memory spaces.  "Device" pointers come from sl_buf_alloc(SL_MEM_DEVICE)
 * and live where the backend computes (GPU memory for CUDA; a budgeted host
 * arena for the CPU backend).  "Host" pointers are ordinary (or pinned,
 * from sl_buf_alloc(SL_MEM_HOST)) CPU memory.  Ops take device pointers only, except the
 * small per-sequence metadata arrays (lengths, pad counts, ids on the host
 * side) which are host arrays read before the call returns.
 *
 * Dtypes.  Weights and the KV cache are fp16 (sl_half).  Activations
 * (hidden states, q/k/v, logits) are fp32.  All accumulation is fp32.
 *
 * Queues and events.  Every op and copy is issued on a queue and runs in
 * issue order on that queue; work on different queues is ordered only by
 * events (sl_event_record / sl_queue_wait), as with CUDA streams.  The CPU
 * backend runs copies and memsets on each queue's worker thread and ops
 * inline on the caller's thread after their queue's earlier work (see
 * kernels/cpu/cpu_backend.c; SLUICE_CPU_SYNC_QUEUES=1 makes every call run
 * to completion before it returns).  A NULL queue is the backend's default
 * queue.  Freeing memory (dev_free, host_free) waits for the queues first.
 *
 * Errors: every function returns 0 or a negative SL_E* code and records a
 * message naming the failing call (see common/sl_common.h).
 *
 * Ownership: the backend owns nothing the caller allocated; sl_backend_free
 * releases the backend's own workspaces only.  Callers free what they
 * allocate: an sl_buf by its handle, which carries its size and tier (for
 * the accounting).
 */
#ifndef SL_BACKEND_H
#define SL_BACKEND_H

#include "sl_common.h"
#include "sl_q4.h"

#include <stdbool.h>

typedef struct sl_backend sl_backend;
typedef struct sl_queue sl_queue; /* opaque, backend-defined */
typedef struct sl_event sl_event; /* opaque, backend-defined */

/* ---- op arguments ------------------------------------------------------ */

enum sl_gemm_flags {
	SL_GEMM_RELU = 1u << 0,  /* y = max(y, 0) before accumulation */
	SL_GEMM_ACCUM = 1u << 1, /* add into y instead of overwriting it */
};

/*
 * y[m, n] (+)= act(alpha * (sum_k x[m, k] * w[n, k] + bias[n]))
 *   x: fp32 (m, k) with row stride ldx; w: fp16 (n, k) row-major, stride k
 *   (the PyTorch nn.Linear layout); bias: fp16 (n) or NULL; y: fp32 (m, n)
 *   with row stride ldy.  x and y must not overlap.
 * 4-bit weights (issue 14): wq instead of w (w NULL), the (n, k) matrix
 *   quantised in common/sl_q4.h's layout (sl_q4_bytes(n, k): all codes,
 *   then all {mn16, scale16}); the product uses the dequantised fp32
 *   values q / scale16 + mn16, which the kernels compute tile by tile (no
 *   copy of the whole matrix).
 */
typedef struct sl_gemm_args {
	int m, n, k;
	const float *x;
	int ldx;
	const sl_half *w;
	const void *wq; /* sl_q4 layout, when w is NULL */
	const sl_half *bias; /* (optional) */
	float *y;
	int ldy;
	float alpha; /* 0 is taken as 1 */
	unsigned flags; /* enum sl_gemm_flags */
} sl_gemm_args;

/*
 * Attention over a KV cache.  Shapes:
 *   nseq sequences, nh query heads, hd = head dim, hidden = nh * hd;
 *   nkv KV heads (grouped-query attention; 0 is read as nh, multi-head
 *   attention), nkv >= 1 dividing nh: query head h uses KV head
 *   h / (nh / nkv), the order of transformers' repeat_kv, so the nh / nkv
 *   query heads of a group are consecutive.  kv = nkv * hd values per
 *   token of k and v.  Any other nkv (< 0, or not dividing nh) fails with
 *   SL_EINVAL.
 *   cache k, v: fp16, or fp32 where kv_f32 is set (an accuracy mode:
 *   fp16 rounding of K and V is the one difference from an fp32
 *   reference), token-major (nseq, cap, nkv, hd): slot s of sequence b,
 *   KV head g at ((b * cap + s) * nkv + g) * hd, so one slot of a sequence
 *   holds every KV head's row of that token contiguously (kv values) and
 *   sequence b's block is the cap * kv values from b * cap * kv.  The
 *   cache holds the KV heads only (GQA's memory saving).
 *   Slots hold real tokens only (never padding), in any order; positions
 *   were added before projection (OPT) or rotated into q and k before the
 *   call (RoPE), so slot order does not change the result.
 *   q is expected already scaled by 1/sqrt(hd).
 *
 * Prefill: q and out are fp32 (nseq, t, hidden), k_new and v_new fp32
 *   (nseq, t, kv), left-padded: sequence b's first npad[b] rows are
 *   padding.  Writes the t - npad[b] real rows' k and v into cache slots
 *   [0, t - npad[b]), computes causal attention among the real rows of
 *   each sequence, writes zero rows in out for the padding rows.
 *
 * Decode: one new token per sequence: q and out are fp32 (nseq, hidden),
 *   k_new and v_new fp32 (nseq, kv).  Sequence b holds len[b] cached
 *   tokens in slots [0, len[b]); the new k, v are written to slot len[b]
 *   (for each of k and v one contiguous range of kv values, from (b * cap
 *   + len[b]) * kv) and attention runs over slots [0, len[b]] inclusive.
 *   The caller advances len.
 *
 * Compressed cache (kv_q4, compress_cache): each slot (one token of one
 *   sequence, all nkv KV heads) is a quantised (nkv, hd) matrix in the
 *   layout of common/sl_q4.h, sl_q4_bytes(nkv, hd) bytes
 *   (sl_kv_slot_bytes(nkv, ...)): groups of 64 along head_dim per head (hd
 *   not a multiple of 64 pads its last group), the codes of every KV head
 *   first, then their {mn16, scale16}.  Slot s of sequence b starts at
 *   byte (b * cap + s) * slot_bytes, so a slot is still one self-contained
 *   byte range (H2O's moves, the tiers' paging).  k_new and v_new are
 *   rounded to fp16 and quantised with sl_q4_quantize_group when written;
 *   attention reads the dequantised values, the new token's too.  kv_f32
 *   and kv_q4 exclude each other.
 *
 * score (optional): fp32 (nseq, nkv, cap), per KV head and head-major
 *   unlike the cache: slot s of sequence b, KV head g at (b * nkv + g) *
 *   cap + s.  When given, the attention probability each query head gives
 *   each cached slot is added to that slot's score, summed over the nh /
 *   nkv query heads of the slot's group (H2O: the cache holds one token
 *   set per KV head, so the group decides together what it keeps; with
 *   nkv = nh this is the per-head score).  For prefill that is the column
 *   sum over the sequence's real queries, summed over the group.
 */
typedef struct sl_attn_args {
	int nseq, nh, hd;
	int nkv; /* KV heads: divides nh; 0 is nh */
	int t;   /* prefill: padded rows per sequence; decode: 1 */
	int cap; /* cache slots per sequence (each holds all nkv KV heads) */
	const float *q, *k_new, *v_new; /* q: rows of hidden; k_new, v_new: rows of kv */
	float *out;                     /* rows of hidden */
	void *k_cache, *v_cache; /* (nseq, cap, nkv, hd): sl_half, float where kv_f32,
				  * sl_q4 slots where kv_q4 */
	bool kv_f32;
	bool kv_q4;
	const int *npad; /* prefill: host (nseq) */
	const int *len;  /* decode: host (nseq) */
	float *score;    /* (optional) device (nseq, nkv, cap) */
} sl_attn_args;

/* The KV heads of a, nkv where set, else nh (multi-head attention). */
static inline int sl_attn_nkv(const sl_attn_args *a)
{
	return a->nkv ? a->nkv : a->nh;
}

/* For backends: the head counts' checks of the attention ops (nh >= 1,
 * nkv 0 or dividing nh), one message for both (who names the backend's
 * op, e.g. "cuda attn_decode"); 0 or SL_EINVAL. */
int sl_attn_check_heads(const char *who, const sl_attn_args *a);

/*
 * H2O (Heavy-Hitter Oracle) cache maintenance, per (sequence, head).
 * nh is the cache's heads: with grouped-query attention the caller passes
 * the KV heads (sl_attn_args' nkv), and score is attention's per-KV-head,
 * group-summed one; a head below is a KV head.
 * Budgets: heavy[s] = H and recent[s] = R tokens, B = H + R.  The H2O cache
 * has cap >= B + 1 slots; slot j holds a token of position pos[j] with
 * accumulated attention score[j]; slots [len, cap) are free with score 0
 * and pos -1.  Ties: the older position is evicted first.  Each head keeps
 * its own set of tokens, so slot j of one sequence may hold different
 * tokens in different heads.
 *
 * Layouts (as sl_attn_args): the caches k_cache, v_cache and the scratch
 * k_src, v_src are token-major, (nseq, cap, nh, hd) (cap_in for the
 * scratch): slot j of sequence b, head h at ((b * cap + j) * nh + h) * hd.
 * score, pos (and score_src) are head-major, (nseq, nh, cap): slot j of
 * sequence b, head h at (b * nh + h) * cap + j; evicted is (nseq, nh).
 *
 * compact (after prefill): the prefill ran over a scratch cache (k_src,
 *   v_src, score_src; cap_in slots; sequence s's n[s] prompt tokens in
 *   slots [0, n[s]) at positions 0..n[s]-1, with their column-sum scores).
 *   Keeps all of them if n[s] <= B, else the last R and the H highest
 *   scoring among the others; writes them to slots [0, kept) in position
 *   order; the evicted tokens' scores are added to evicted (optional).
 *
 * With kv_q4 the caches and the scratch hold sl_q4 slots (sl_attn_args): a
 *   (sequence, head) row moved is that head's codes and its {mn16,
 *   scale16} pairs within the slot, copied as bytes.
 *
 * evict (after a decode step): attn_decode wrote the new token to slot
 *   len[s] and added every slot's probability to score.  Sets pos[len[s]] =
 *   cur[s]; if the cache now holds B + 1 tokens, evicts the lowest-scoring
 *   token among those outside the recent window (positions <= cur - R),
 *   moves the new token into its slot when it is not the victim, and frees
 *   slot len[s].  The caller then holds min(len + 1, B) tokens.
 */
typedef struct sl_h2o_args {
	int nseq, nh, hd;
	bool kv_f32;
	bool kv_q4;
	const void *k_src, *v_src; /* compact: scratch (nseq, cap_in, nh, hd) */
	const float *score_src;    /* compact: (nseq, nh, cap_in) */
	int cap_in;
	void *k_cache, *v_cache;   /* (nseq, cap, nh, hd) */
	float *score;              /* (nseq, nh, cap) */
	int32_t *pos;              /* (nseq, nh, cap) */
	int cap;
	const int *n;              /* compact: host (nseq) */
	const int *len;            /* evict: host (nseq) */
	const int *cur;            /* evict: host (nseq) */
	const int *heavy, *recent; /* host (nseq) */
	float *evicted;            /* (optional) device (nseq, nh) */
} sl_h2o_args;

/*
 * Rotary position embedding (RoPE), applied in place, in the rotate_half
 * convention of Hugging Face's Llama (not the interleaved one of the
 * original paper): each head's row of hd values is two halves, and pair i
 * (i < hd / 2) is x[i] and x[i + hd / 2].  For row r at position p =
 * pos[r], with the angle a = (float)p * inv_freq[i] rounded to fp32 (as
 * transformers' fp32 product of positions and inverse frequencies), c =
 * cos(a), s = sin(a):
 *   x[i]          = x[i] * c - x[i + hd/2] * s
 *   x[i + hd/2]   = x[i + hd/2] * c + x[i] * s
 * in fp32, for each of the nh_q heads of q's row and the nh_k heads of k's
 * row (grouped-query attention: nh_k <= nh_q, their own strides; nh_k 0
 * or k NULL leaves k alone).  Head h of row r is at q + r * ldq + h * hd
 * (ldq >= nh_q * hd; k alike).  Each row has its own position, so left
 * padding and H2O's kept tokens need nothing else.
 *
 * pos and inv_freq are host arrays read before the call returns: pos
 * (rows), each >= 0; inv_freq (hd / 2), from sl_rope_inv_freq (rope_theta
 * and rope_scaling on the host, one formula on the device).  hd is even,
 * 2..SL_ROPE_MAX_HD (the CUDA backend carries inv_freq in its kernel
 * parameters).  transformers' attention_scaling is 1 for every scaling
 * sl_rope_inv_freq knows, so there is none here.
 */
#define SL_ROPE_MAX_HD 512
typedef struct sl_rope_args {
	int rows, hd;
	int nh_q, nh_k;
	float *q;
	int ldq;
	float *k; /* (optional) */
	int ldk;
	const int32_t *pos;     /* host (rows) */
	const float *inv_freq;  /* host (hd / 2) */
} sl_rope_args;

/* rope_scaling of a Hugging Face config (its "rope_type", or "type"). */
typedef enum sl_rope_type {
	SL_ROPE_DEFAULT = 0, /* none */
	SL_ROPE_LINEAR,      /* inverse frequencies / factor */
	SL_ROPE_LLAMA3,      /* Llama 3.1's smooth per-frequency scaling */
} sl_rope_type;

typedef struct sl_rope_scaling {
	sl_rope_type type;
	double factor;                /* linear, llama3: > 0 */
	double low_freq_factor;       /* llama3 */
	double high_freq_factor;      /* llama3: > low_freq_factor */
	int original_max_position_embeddings; /* llama3: > 0 */
} sl_rope_scaling;

/*
 * The hd / 2 inverse frequencies of RoPE for rope_theta and a scaling
 * (NULL: none), as transformers' rope initialisation computes them in
 * fp32 (kernels/rope_freq.c says where its rounding can differ):
 *   default  inv_freq[i] = 1 / theta^(2i / hd)
 *   linear   inv_freq[i] / factor
 *   llama3   per frequency, by its wavelength 2 pi / inv_freq against
 *            original_max_position_embeddings / low_freq_factor (longer:
 *            divided by factor) and .. / high_freq_factor (shorter: kept),
 *            between the two a smooth mix of the two.
 * Fails with SL_EINVAL naming the bad value (hd odd or out of range, theta
 * <= 0, a factor out of range, an unknown type).
 */
int sl_rope_inv_freq(int hd, double theta, const sl_rope_scaling *s, float *inv_freq);

/* For backends: the shape checks of the rope op, one message for both
 * (who names the backend's op, e.g. "cuda rope"); 0 or SL_EINVAL. */
int sl_rope_check(const char *who, const sl_rope_args *a);

/* Bytes of one KV cache slot (one token, all nh heads of the cache: the KV
 * heads, nkv, under grouped-query attention): fp16, fp32, or a quantised
 * (nh, hd) sl_q4 matrix. */
static inline size_t sl_kv_slot_bytes(int nh, int hd, bool f32, bool q4)
{
	if (q4)
		return sl_q4_bytes((size_t)nh, (size_t)hd);
	return (size_t)nh * (size_t)hd * (f32 ? sizeof(float) : sizeof(sl_half));
}

/* What a backend says about the device it computes on. */
typedef struct sl_device_info {
	char name[256];       /* e.g. "NVIDIA H100 80GB HBM3"; the backend's name where it has no device */
	char pci_bus_id[32];  /* "0000:65:00.0"; empty where there is none */
	size_t memory_bytes;  /* device memory; 0 where the device is the host */
	int numa_node;        /* the NUMA node the backend places pinned memory on; -1: none chosen */
} sl_device_info;

/* ---- the interface ----------------------------------------------------- */

typedef struct sl_backend_ops {
	const char *name; /* "cpu", "cuda" */
	/* device memory is ordinary host memory (the CPU backend): the disk
	 * tier may read into it directly */
	bool dev_is_host;
	void (*free)(sl_backend *b);

	/* memory: raw allocation; accounting lives in the sl_dev_* wrappers */
	int (*dev_alloc)(sl_backend *b, size_t bytes, void **out);
	void (*dev_free)(sl_backend *b, void *p);
	int (*host_alloc)(sl_backend *b, size_t bytes, void **out); /* pinned */
	void (*host_free)(sl_backend *b, void *p);

	/* queues, events, copies and ops: one member per entry of
	 * backend_ops.def, where each is documented */
#define SL_BACKEND_CALL(ret, fn, params, args) ret (*fn) params;
#define SL_BACKEND_OP(fn, params, args) int (*fn) params;
#include "backend_ops.def"

	/* (optional) the device's name, PCI address, memory */
	int (*device_info)(sl_backend *b, sl_device_info *out);
} sl_backend_ops;

struct sl_backend {
	const sl_backend_ops *ops;
	void *ctx;
	/* device-tier accounting, kept by sl_dev_alloc / sl_dev_free */
	size_t dev_limit; /* 0: unlimited */
	size_t dev_used, dev_peak;
	/* of which through sl_dev_alloc (the callers' data, not the backend's
	 * own workspaces): what a run plan states */
	size_t data_used, data_peak;
	/* host-tier (pinned) accounting, kept by sl_host_alloc / sl_host_free */
	size_t host_limit; /* 0: unlimited */
	size_t host_used, host_peak;
	bool host_refused; /* the last budget refusal was the host's (for messages) */
	/* GEMM time and work, kept by backends whose ops run synchronously (the
	 * CPU backend); zero elsewhere, where callers time with wall clocks */
	double gemm_seconds, gemm_flop;
	/* CPU threads, as sl_backend_create was asked (--threads): the CPU
	 * backend's op threads (0 became the core count); for a device
	 * backend, those of any CPU work beside it (cpu_cache_compute's
	 * attention), 0 meaning all cores */
	int nthreads;
};

/* ---- registry ---------------------------------------------------------- */

/*
 * Create a backend by name: "cpu", "cuda", or "auto" (cuda where a usable
 * GPU is found, else cpu).  nthreads: CPU threads (0 = all cores).
 */
int sl_backend_create(const char *name, int nthreads, sl_backend **out);
void sl_backend_free(sl_backend *b);

/* The backend sl_backend_create(name) would make, without making it: "auto"
 * becomes "cuda" or "cpu" as it would; any other name is returned as is. */
const char *sl_backend_resolve(const char *name);
bool sl_backend_cuda_built(void);

/* The device's name, PCI bus id and memory, where the backend knows them
 * (sl_device_info); the backend's name, an empty bus id and node -1 elsewhere. */
int sl_backend_device_info(sl_backend *b, sl_device_info *out);

/* Byte budget for the device tier (0 = unlimited). */
void sl_backend_set_dev_limit(sl_backend *b, size_t bytes);

void sl_backend_set_host_limit(sl_backend *b, size_t bytes);

/* The tier of a buffer: device memory (sl_dev_alloc's) or pinned host
 * memory (sl_host_alloc's).  0: none. */
enum sl_mem_tier { SL_MEM_DEVICE = 1, SL_MEM_HOST = 2 };

/*
 * A buffer that knows its size and tier: what runtime/ and offload/ hold.
 * Allocated under its tier's budget and accounting as sl_dev_alloc /
 * sl_host_alloc below; sl_buf_free gives back exactly bytes to the tier
 * it came from and zeroes the handle, so freeing a zeroed handle (one
 * never allocated, a failed allocation's, one freed already) does
 * nothing.  Typed access is the caller's: (char *)buf.p + offset.
 */
typedef struct sl_buf {
	void *p;
	size_t bytes;
	unsigned char tier; /* enum sl_mem_tier; 0 in a zeroed handle */
} sl_buf;

/* tier: SL_MEM_DEVICE or SL_MEM_HOST; what names the allocation in the
 * error message.  *out is zeroed on failure. */
int sl_buf_alloc(sl_backend *b, int tier, size_t bytes, const char *what, sl_buf *out);
void sl_buf_free(sl_backend *b, sl_buf *buf);

/* The raw forms sl_buf is made of, for tests and benches that manage a
 * pointer themselves; the caller gives back the size it allocated.
 * Device allocation with accounting; fails with SL_EBUDGET over the limit.
 * what names the allocation in the error message. */
int sl_dev_alloc(sl_backend *b, size_t bytes, const char *what, void **out);
void sl_dev_free(sl_backend *b, void *p, size_t bytes);
/* Pinned host allocation under the host-tier budget (--cpu-mem); 4 KiB
 * aligned, so the disk tier can read into it with O_DIRECT. */
int sl_host_alloc(sl_backend *b, size_t bytes, const char *what, void **out);
void sl_host_free(sl_backend *b, void *p, size_t bytes);

/* For a backend's own workspaces (cuBLAS): account without allocating. */
int sl_dev_account(sl_backend *b, size_t bytes, const char *what);
void sl_dev_unaccount(sl_backend *b, size_t bytes);

/* ---- thin wrappers (NULL-checked) -------------------------------------- */

/* Records "backend '<name>' has no <what>" and returns SL_EUNSUPPORTED. */
int sl_backend_missing(sl_backend *b, const char *what);

/*
 * sl_<fn>(b, ...) = b->ops-><fn>(b, ...) for every entry of backend_ops.def
 * (sl_queue_create, sl_event_record, sl_copy_h2d, sl_gemm, sl_attn_decode,
 * ...): the way callers reach a backend.  Where the member is NULL an int
 * call fails with SL_EUNSUPPORTED (sl_backend_missing) and a void one
 * does nothing.
 */
#define SL_BACKEND_WRAP_int(fn, params, args)                                 \
	static inline int sl_##fn params                                      \
	{                                                                     \
		if (!b->ops->fn)                                              \
			return sl_backend_missing(b, #fn);                    \
		return b->ops->fn args;                                       \
	}
#define SL_BACKEND_WRAP_void(fn, params, args)                                \
	static inline void sl_##fn params                                     \
	{                                                                     \
		if (b->ops->fn)                                               \
			b->ops->fn args;                                      \
	}
#define SL_BACKEND_CALL(ret, fn, params, args) SL_BACKEND_WRAP_##ret(fn, params, args)
#define SL_BACKEND_OP(fn, params, args) SL_BACKEND_WRAP_int(fn, params, args)
#include "backend_ops.def"
#undef SL_BACKEND_WRAP_int
#undef SL_BACKEND_WRAP_void

#endif
