/*
 * sl_json.h - writing JSON with jansson, every setter checked.
 *
 * jansson's constructors return NULL on failure (out of memory, a string
 * that is not UTF-8, json_real of a NaN or an infinity) and its setters
 * return -1, and a dropped return leaves a field silently missing from the
 * output.  These helpers record the first failure in an sl_jerr, so that a
 * writer sets every field and checks once, and the check becomes an
 * sl_err() naming the field: an output is whole or it is an error.
 *
 *     sl_jerr e = { 0 };
 *     json_t *o = json_object();
 *     sl_jset(o, "batch", json_integer(b), &e);
 *     sl_jset_real(o, "wall_s", wall, &e);
 *     if ((rc = sl_jcheck(&e, "bench --json")) < 0) ...
 *
 * json_object_set_new and json_array_append_new release the value even
 * when they fail, and take a NULL container or value as a failure, so a
 * chain of setters never leaks and never needs a check in between.
 */
#ifndef SL_JSON_H
#define SL_JSON_H

#include "sl_common.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct sl_jerr {
	const char *key; /* the first field that could not be set, or NULL */
	bool nonfinite;  /* ... because its value was NaN or infinite */
	double value;
} sl_jerr;

static inline void sl_jfail(sl_jerr *e, const char *key, bool nonfinite, double value)
{
	if (!e->key) {
		e->key = key;
		e->nonfinite = nonfinite;
		e->value = value;
	}
}

/* obj[key] = v (v is stolen; NULL is a failure). */
static inline void sl_jset(json_t *obj, const char *key, json_t *v, sl_jerr *e)
{
	if (json_object_set_new(obj, key, v) < 0)
		sl_jfail(e, key, false, 0);
}

/* obj[key] = a finite number (JSON has no NaN or infinity). */
static inline void sl_jset_real(json_t *obj, const char *key, double v, sl_jerr *e)
{
	if (!isfinite(v))
		sl_jfail(e, key, true, v);
	else
		sl_jset(obj, key, json_real(v), e);
}

/* Append v to arr (v is stolen); what names the array in a failure. */
static inline void sl_jappend(json_t *arr, json_t *v, const char *what, sl_jerr *e)
{
	if (json_array_append_new(arr, v) < 0)
		sl_jfail(e, what, false, 0);
}

static inline void sl_jappend_real(json_t *arr, double v, const char *what, sl_jerr *e)
{
	if (!isfinite(v))
		sl_jfail(e, what, true, v);
	else
		sl_jappend(arr, json_real(v), what, e);
}

/* 0, or the error of the first failure; where names the output. */
static inline int sl_jcheck(const sl_jerr *e, const char *where)
{
	if (!e->key)
		return 0;
	if (e->nonfinite)
		return sl_err(SL_ERANGE, "%s: \"%s\" is %g, which JSON cannot hold", where, e->key,
			      e->value);
	return sl_err(SL_ENOMEM, "%s: cannot set \"%s\" (out of memory, or text that is not UTF-8)",
		      where, e->key);
}

/* Write j to f as one line (compact, fields in the order set) and flush. */
static inline int sl_jwrite_line(const json_t *j, FILE *f, const char *where)
{
	if (json_dumpf(j, f, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0 || fputc('\n', f) == EOF ||
	    fflush(f) != 0)
		return sl_err(SL_EIO, "%s: write failed", where);
	return 0;
}

#endif
