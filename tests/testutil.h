/*
 * testutil.h - small helpers the Check test programs share: running a
 * suite, and reading the prompts of a Hugging Face fixture.
 */
#ifndef SL_TESTUTIL_H
#define SL_TESTUTIL_H

#include <check.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

/* Run every test of s; the exit status for main (0: all passed). */
static inline int sl_test_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

/* The prompts of fixture DIR/NAME/golden.json (at most 16 of 64 tokens). */
static inline void sl_test_prompts(const char *dir, const char *name, int *np, int plen[16],
				   int32_t prompts[16][64])
{
	char path[600];
	snprintf(path, sizeof path, "%s/%s/golden.json", dir, name);
	json_t *g = json_load_file(path, 0, NULL);
	ck_assert_msg(g != NULL, "cannot read %s", path);
	json_t *pr = json_object_get(g, "prompts");
	*np = (int)json_array_size(pr);
	ck_assert_int_le(*np, 16);
	for (int i = 0; i < *np; i++) {
		json_t *p = json_array_get(pr, (size_t)i);
		plen[i] = (int)json_array_size(p);
		ck_assert_int_le(plen[i], 64);
		for (int j = 0; j < plen[i]; j++)
			prompts[i][j] = (int32_t)json_integer_value(json_array_get(p, (size_t)j));
	}
	json_decref(g);
}

#endif
