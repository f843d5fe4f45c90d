/*
 * sl_common.c - the one table of error texts, the per-thread error message,
 * and small helpers (aligned allocation, size parsing, clock).
 */
#define _POSIX_C_SOURCE 200809L
#include "sl_common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static const char *const sl_error_text[SL_E_COUNT_] = {
	[0] = "success",
	[-SL_EINVAL] = "invalid argument",
	[-SL_ENOMEM] = "out of host memory",
	[-SL_EIO] = "input/output error",
	[-SL_EFORMAT] = "corrupt or malformed file",
	[-SL_ESHAPE] = "tensor of the wrong shape or dtype",
	[-SL_ENOTFOUND] = "not found",
	[-SL_EUNSUPPORTED] = "not supported",
	[-SL_EBUDGET] = "memory budget too small",
	[-SL_EDEVICE] = "GPU error",
	[-SL_ERANGE] = "value out of range",
	[-SL_EINTERRUPTED] = "interrupted",
};

const char *sl_strerror(int code)
{
	if (code > 0 || -code >= SL_E_COUNT_ || !sl_error_text[-code])
		return "unknown error";
	return sl_error_text[-code];
}

static _Thread_local char sl_msg[1024];

int sl_err(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(sl_msg, sizeof sl_msg, fmt, ap);
	va_end(ap);
	return code;
}

int sl_err_prefix(int code, const char *fmt, ...)
{
	char prefix[512], old[sizeof sl_msg];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	memcpy(old, sl_msg, sizeof old);
	const char *rest = old[0] ? old : sl_strerror(code);
	size_t np = strlen(prefix);
	if (np > sizeof sl_msg - 3)
		np = sizeof sl_msg - 3;
	memcpy(sl_msg, prefix, np);
	memcpy(sl_msg + np, ": ", 2);
	size_t nr = strlen(rest);
	if (nr > sizeof sl_msg - np - 3)
		nr = sizeof sl_msg - np - 3;
	memcpy(sl_msg + np + 2, rest, nr);
	sl_msg[np + 2 + nr] = 0;
	return code;
}

const char *sl_errmsg(void)
{
	return sl_msg[0] ? sl_msg : "no error recorded";
}

void sl_err_clear(void)
{
	sl_msg[0] = 0;
}

void *sl_aligned_alloc(size_t bytes)
{
	void *p = NULL;
	if (bytes == 0)
		bytes = 64;
	if (posix_memalign(&p, 64, bytes) != 0)
		return NULL;
	return p;
}

void *sl_io_alloc(size_t bytes)
{
	const size_t huge = (size_t)2 << 20;
	const size_t n = bytes ? (bytes + 4095) & ~(size_t)4095 : 4096;
	void *p = NULL;
	if (posix_memalign(&p, n >= huge ? huge : 4096, n) != 0)
		return NULL;
#ifdef MADV_HUGEPAGE
	if (n >= huge)
		(void)madvise(p, n & ~(huge - 1), MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
	return p;
}

int sl_parse_size(const char *s, size_t *out)
{
	char *end = NULL;
	if (!s || !*s)
		return sl_err(SL_EINVAL, "empty size");
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v >= 0) || !isfinite(v))
		return sl_err(SL_EINVAL, "'%s' is not a size (use bytes or K, M, G, T)", s);
	double mul = 1;
	switch (toupper((unsigned char)*end)) {
	case 0: break;
	case 'K': mul = 1024.0; end++; break;
	case 'M': mul = 1024.0 * 1024; end++; break;
	case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
	case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: return sl_err(SL_EINVAL, "'%s' is not a size (use bytes or K, M, G, T)", s);
	}
	if (toupper((unsigned char)*end) == 'I' && toupper((unsigned char)end[1]) == 'B')
		end += 2;
	else if (toupper((unsigned char)*end) == 'B')
		end++;
	if (*end)
		return sl_err(SL_EINVAL, "'%s' is not a size (use bytes or K, M, G, T)", s);
	double bytes = v * mul;
	if (bytes > 9.0e18)
		return sl_err(SL_ERANGE, "size '%s' is too large", s);
	*out = (size_t)bytes;
	return 0;
}

double sl_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double sl_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
