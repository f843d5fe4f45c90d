/*
 * jsonl.h - job input and output as JSON Lines.
 *
 * Input: one object per line.  Generation: "prompt" (text, needs the
 * model's tokenizer; encoded with OPT's leading </s> as Hugging Face does)
 * or "input_ids"; optional "id" (any JSON value; the 1-based line number
 * where absent) and "max_new_tokens".  Scoring adds "continuation" (text,
 * encoded without </s>) or "continuation_ids".  A line with both forms of
 * one is refused.  Unknown fields are ignored, blank lines skipped, and a
 * UTF-8 byte-order mark at the start of the file too.
 *
 * Output: written to OUT.partial, flushed to disk block by block, renamed
 * to OUT when the job completes: an OUT that exists is whole, and an
 * interrupted job's OUT.partial holds whole lines that --resume continues.
 * The path "-" is standard output (lines as each block ends, no .partial,
 * no resume); for input, standard input.
 *
 * A path ending in .zst is zstd-compressed: an input is decompressed as it
 * is read (a truncated or corrupt one is an error naming the file and the
 * byte); an output is written one frame (with a checksum) per
 * sl_output_sync, and resumed by whole frames.
 */
#ifndef SL_JSONL_H
#define SL_JSONL_H

#include "tokenizer.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct sl_prompt {
	char *id_json;   /* the id, serialised compactly (owned) */
	int32_t *ids;    /* owned; NULL for a bad line */
	int n;
	int32_t *cont;   /* scoring: the continuation (owned) */
	int ncont;
	int line;        /* 1-based line in the input file */
	int max_new;     /* per-line max_new_tokens, 0 where absent */
	char *error;     /* --skip-bad-lines: what is wrong with the line */
} sl_prompt;

typedef struct sl_prompts {
	sl_prompt *p;
	int n;
	int bad; /* lines kept as errors */
} sl_prompts;

typedef struct sl_read_opts {
	int vocab;
	const sl_tokenizer *tok; /* NULL: text fields are an error */
	bool score;              /* lines need a continuation */
	bool skip_bad_lines;     /* record bad lines as errors and go on */
} sl_read_opts;

/* Read and validate every line (ids in [0, vocab)); path "-": stdin. */
int sl_prompts_read(const char *path, const sl_read_opts *o, sl_prompts *out);
void sl_prompts_free(sl_prompts *ps);

typedef struct sl_output sl_output;

enum sl_output_mode {
	SL_OUT_NEW,       /* refuse an existing OUT or OUT.partial */
	SL_OUT_OVERWRITE, /* start again */
	SL_OUT_RESUME,    /* continue OUT.partial (or find OUT complete) */
};

/* Opens OUT.partial for writing, checking before any compute that OUT is
 * not a folder (or another file that is not a regular one) and that its
 * folder is writable.  With SL_OUT_RESUME and a complete OUT, *complete is
 * set and OUT is opened for reading only, for sl_output_lines (its ids are
 * checked against the input); nothing is written. */
int sl_output_open(const char *path, enum sl_output_mode mode, sl_output **out, bool *complete);

/* Resume: the whole lines already in OUT.partial: their ids (compact JSON,
 * owned by o) and the byte offset where each ends (for .zst, in the
 * decompressed stream, only in frames that are whole). */
int sl_output_lines(sl_output *o, int *n, char ***ids, off_t **ends);
/* Cut OUT.partial after `off` bytes (one of sl_output_lines' ends, or 0)
 * and append from there. */
int sl_output_truncate(sl_output *o, off_t off);

/* Append one line (without its newline). */
int sl_output_write(sl_output *o, const char *line, size_t len);
/* Flush to the disk: the lines written so far survive a crash. */
int sl_output_sync(sl_output *o);
/* Flush, sync and rename OUT.partial to OUT. */
int sl_output_commit(sl_output *o);
const char *sl_output_path(const sl_output *o);
/* Close; OUT.partial stays unless `discard` (then it is removed). */
void sl_output_close(sl_output *o, bool discard);

#endif
