/*
 * safetensors.h - read-only access to Hugging Face safetensors checkpoints:
 * one file, or shards listed by model.safetensors.index.json, memory-mapped.
 *
 * Every header is validated when opened (length within the file, JSON,
 * known dtypes, shapes matching byte sizes, offsets in range and not
 * overlapping), so a tensor handed out is always backed by mapped bytes.
 */
#ifndef SL_SAFETENSORS_H
#define SL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum sl_dtype {
	SL_DT_F32,
	SL_DT_F16,
	SL_DT_BF16,
	SL_DT_OTHER /* a dtype sluice cannot convert (I8, F64, ...) */
};

typedef struct sl_st_tensor {
	const char *name;
	enum sl_dtype dtype;
	char dtype_name[8];
	int ndim;
	int64_t shape[8];
	const void *data; /* into the mapping; not aligned in general */
	size_t nbytes;
	const char *file; /* the shard it lives in */
} sl_st_tensor;

typedef struct sl_st_set sl_st_set;

/* One file of a set, as it was when opened (fstat of the descriptor that
 * was mapped): what a cache of its converted contents must be keyed on. */
typedef struct sl_st_file {
	const char *path;
	uint64_t size;
	int64_t mtime_s, mtime_ns; /* modification time */
	int64_t ctime_s, ctime_ns; /* status change time: any write, rename,
				      replacement, even with the mtime set back */
	uint64_t header_hash;      /* FNV-1a 64 of the length and JSON header */
} sl_st_file;

/* Open DIR/model.safetensors, or the shards named in
 * DIR/model.safetensors.index.json.  The set owns the mappings. */
int sl_st_open_dir(const char *dir, sl_st_set **out);
/* Open one safetensors file. */
int sl_st_open_file(const char *path, sl_st_set **out);
void sl_st_close(sl_st_set *s);

/* The tensor named exactly name, or NULL. */
const sl_st_tensor *sl_st_find(const sl_st_set *s, const char *name);
size_t sl_st_count(const sl_st_set *s);
const sl_st_tensor *sl_st_at(const sl_st_set *s, size_t i);

/* Bytes [off, off + len) of t, read and no longer needed, leave the
 * process's memory: the whole pages among them are unmapped from its RSS
 * (madvise MADV_DONTNEED; the page cache keeps them as long as the kernel
 * does).  The mapping is private and never written, so reading them again
 * maps the file's bytes again: a hint, never a change of contents.  So a
 * checkpoint converted a tensor at a time is not resident beside its
 * converted copy. */
void sl_st_release(const sl_st_tensor *t, size_t off, size_t len);

/* The files of the set (one, or every shard), in the order opened. */
size_t sl_st_nfiles(const sl_st_set *s);
const sl_st_file *sl_st_file_at(const sl_st_set *s, size_t i);

#endif
