/*
 * sl_common.h - error codes, the error message, assertions and fp16/bf16
 * conversion shared by every layer of sluice.
 *
 * Error convention (zstd / liburing style): library functions return int,
 * 0 on success or a negative SL_E* code.  The function that detects a
 * problem records a one-line human message with the detail (file, tensor,
 * line, byte offset) through sl_err(); callers above it may prefix context
 * with sl_err_prefix().  sl_strerror() maps a code to its generic text from
 * one table (sl_common.c).  Nothing below tools/ calls exit().
 */
#ifndef SL_COMMON_H
#define SL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum sl_status {
	SL_OK = 0,
	SL_EINVAL = -1,       /* bad argument or option value */
	SL_ENOMEM = -2,       /* host allocation failed */
	SL_EIO = -3,          /* read/write/open failed */
	SL_EFORMAT = -4,      /* corrupt or malformed file contents */
	SL_ESHAPE = -5,       /* tensor of the wrong shape or dtype */
	SL_ENOTFOUND = -6,    /* missing file, tensor or field */
	SL_EUNSUPPORTED = -7, /* valid input this build cannot run */
	SL_EBUDGET = -8,      /* a memory budget is too small */
	SL_EDEVICE = -9,      /* GPU driver, CUDA or cuBLAS failure */
	SL_ERANGE = -10,      /* a value outside its allowed range */
	SL_EINTERRUPTED = -11,/* stopped by a signal */
	SL_E_COUNT_ = 12
};

/* Generic text for a code ("corrupt or malformed file", ...). */
const char *sl_strerror(int code);

/*
 * Record the message for the current error on this thread and return code,
 * so that a failing path reads `return sl_err(SL_EFORMAT, "%s: ...", path)`.
 */
int sl_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the recorded message with "<context>: ", returns code unchanged. */
int sl_err_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last recorded message on this thread, or sl_strerror of nothing. */
const char *sl_errmsg(void);
void sl_err_clear(void);

/* Programmer errors: active in release builds too; print and abort. */
#define SL_ASSERT(x)                                                          \
	do {                                                                  \
		if (!(x)) {                                                   \
			fprintf(stderr, "sluice: assertion failed: %s (%s:%d)\n",   \
				#x, __FILE__, __LINE__);                      \
			abort();                                              \
		}                                                             \
	} while (0)

/* Propagate a negative status. */
#define SL_TRY(expr)                                                          \
	do {                                                                  \
		int sl_try_rc_ = (expr);                                      \
		if (sl_try_rc_ < 0)                                           \
			return sl_try_rc_;                                    \
	} while (0)

/* The commit sluice was built from, and a hash of the changes not
 * committed ("COMMIT" or "COMMIT-dirty-HASH", tools/build_id.sh), or
 * "unknown": common/sl_build.c.in, generated at every build. */
extern const char sl_build_id[];

/* ---- half precision ----------------------------------------------------- */

typedef uint16_t sl_half; /* IEEE 754 binary16 bits */

/* Exact widening and round-to-nearest-even narrowing, no hardware needed. */
static inline float sl_half_to_float(sl_half h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	uint32_t bits;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while ((man & 0x400u) == 0);
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
		}
	} else if (exp == 31) { /* inf, or a NaN made quiet (as F16C does) */
		bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	union { uint32_t u; float f; } v = { .u = bits };
	return v.f;
}

static inline sl_half sl_float_to_half(float f)
{
	union { float f; uint32_t u; } v = { .f = f };
	uint32_t x = v.u;
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t absx = x & 0x7fffffffu;
	if (absx >= 0x7f800000u) /* inf or nan */
		return (sl_half)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
	if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (sl_half)(sign | 0x7c00u);
	if (absx < 0x38800000u) { /* below the smallest normal half */
		if (absx < 0x33000000u) /* < 2^-25: rounds to zero */
			return (sl_half)sign;
		uint32_t e = absx >> 23;
		uint32_t m = (absx & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - e; /* 14..24 */
		uint32_t half = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (sl_half)(sign | half);
	}
	uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u); /* round to nearest even */
	return (sl_half)(sign | ((r - 0x38000000u) >> 13));
}

static inline float sl_bf16_to_float(uint16_t b)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)b << 16 };
	return v.f;
}

/* ---- small helpers ------------------------------------------------------ */

#define SL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Aligned host allocation (64 bytes), freed with free(). NULL on failure. */
void *sl_aligned_alloc(size_t bytes);

/*
 * Memory that O_DIRECT reads and writes move (the disk tier's
 * destinations and sources), freed with free(); NULL on failure.  Page
 * aligned, a whole number of pages; from 2 MiB up, aligned to 2 MiB and
 * advised as transparent huge pages (MADV_HUGEPAGE, a hint), so that a
 * request's buffer is a few physically contiguous extents rather than
 * scattered 4 KiB pages: a block device takes a bounded number of
 * segments a request (virtio-blk: 254), and on this project's VM reads
 * into huge pages ran at 2.9 to 3.1 GB/s (medians) against 1.3 into 4 KiB
 * pages (bench/results/disk-pages-20261207-103831.md).
 */
void *sl_io_alloc(size_t bytes);

/* Parse "123", "4K", "16G", "1.5G" (binary units) into bytes. */
int sl_parse_size(const char *s, size_t *out);

/* Monotonic seconds. */
double sl_now(void);

/* The median of v[0..n) (n >= 1; the mean of the middle two when n is even).
 * Sorts v in place. */
double sl_median(double *v, int n);

#endif
