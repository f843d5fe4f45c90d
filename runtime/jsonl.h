/*
 * jsonl.h - job input and output as JSON Lines.
 *
 * Input: one object per line with "input_ids" (token ids) and an optional
 * "id" (any JSON value; the 1-based line number where absent); unknown
 * fields are ignored.  Output: one object per input line, in input order,
 * written to a temporary file beside the destination and renamed into
 * place only when complete, so an output file that exists is whole.
 */
#ifndef SL_JSONL_H
#define SL_JSONL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sl_prompt {
	char *id_json;   /* the id, serialised compactly (owned) */
	int32_t *ids;    /* owned */
	int n;
	int line;        /* 1-based line in the input file */
	int max_new;     /* per-line max_new_tokens, 0 where absent */
} sl_prompt;

typedef struct sl_prompts {
	sl_prompt *p;
	int n;
} sl_prompts;

/* Read and validate every line (ids in [0, vocab)). */
int sl_prompts_read(const char *path, int vocab, sl_prompts *out);
void sl_prompts_free(sl_prompts *ps);

typedef struct sl_output sl_output;

/* Refuses an existing file unless overwrite; checks the directory is
 * writable before any compute starts. */
int sl_output_open(const char *path, bool overwrite, sl_output **out);
/* {"id": ..., "output_ids": [...]} */
int sl_output_write(sl_output *o, const sl_prompt *p, const int32_t *ids, int n);
/* Flush, fsync and rename into place. */
int sl_output_commit(sl_output *o);
/* Remove the temporary file (no-op after commit); frees o. */
void sl_output_free(sl_output *o);

#endif
