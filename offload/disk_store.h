/*
 * disk_store.h - the disk tier: one store file per model in the offload
 * directory, read and written with O_DIRECT through io_uring.
 *
 * Layout of the file: a 4 KiB header (magic, version, data size, the key
 * that names the model and layout, a "complete" flag, a checksum), then the
 * data area of data_bytes.  The caller carves the data area into its own
 * 4 KiB-aligned segments; the store only moves bytes.
 *
 * I/O is asynchronous: sl_disk_read()/sl_disk_write() queue a request and
 * hand back a ticket; sl_disk_wait(ticket) blocks until that request is done
 * and returns its status.  A request is split into chunks (1 MiB by default)
 * and up to queue_depth chunks, of at most window_bytes in all, are in
 * flight at once, the oldest request's first; requests beyond that are
 * queued inside the store and started as chunks complete, by a
 * completion thread (io_uring) or a small pool of pread/pwrite threads (the
 * fallback), so I/O keeps going while the caller computes.
 *
 * Engines, chosen once at open:
 *   "io_uring+O_DIRECT"        the normal path (a registered file; the
 *                              buffers are not registered: docs/DESIGN.md)
 *   "threads+pread+O_DIRECT"   io_uring unavailable (ENOSYS, EPERM in
 *                              containers, kernel.io_uring_disabled)
 *   "threads+pread+buffered"   the file system refuses O_DIRECT (EINVAL on
 *                              open); the page cache is dropped behind every
 *                              chunk with posix_fadvise(DONTNEED)
 * A fallback is never silent: open prints one line to stderr,
 * "sluice: warning: <dir>: <why>; using <engine>".
 *
 * Completeness: sl_disk_mark_complete() sets the header's flag after an
 * fdatasync, once the caller has written the whole data area.  A store whose
 * writing was interrupted (crash, disk full) keeps the flag clear, and
 * reopening it reports fresh=true, so the caller rewrites it.  The first
 * write to a complete store clears the flag on disk before any data moves
 * (other requests and completions go on while that header write syncs).
 *
 * Placement: with bind_io the I/O threads (the completion thread or the
 * pool) bind themselves to the cores of NUMA node io_node as they start,
 * before open returns (topology.h: sl_topo_io_node chooses the GPU's node,
 * else the process's; a failure warns once and the threads run unbound).
 *
 * Locking: an open store holds a shared flock on its file until closed, so
 * sl_disk_remove_unused (sluice convert --clean) leaves it alone.
 *
 * Threads: read, write, wait and wait_all may be called from any thread;
 * close must not run concurrently with other calls on the same store.  Buffers handed to read/write belong to the caller and must stay
 * valid (and, for writes, unchanged) until the request has been waited for.
 *
 * Errors follow sl_common.h: 0 or a negative SL_E* code, with a one-line
 * message from sl_errmsg() naming the file and the problem.
 */
#ifndef SL_DISK_STORE_H
#define SL_DISK_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_DISK_ALIGN 4096u              /* offsets, sizes and buffers */
#define SL_DISK_HEADER_BYTES 4096u       /* the header before the data area */
#define SL_DISK_MAX_KEY 4000u            /* longest key, in bytes */
#define SL_DISK_DEFAULT_QD 32
#define SL_DISK_DEFAULT_CHUNK (1u << 20) /* 1 MiB */
/* Bytes in flight at most by default: enough to keep a disk busy (this
 * project's VM disk reads at its full rate with two 1 MiB requests out,
 * the profile's disk_segment_read; an NVMe drive is yet to be measured),
 * few enough that the requests finish in the order they were issued.  A
 * device serves whatever is in flight side by side: with 32 chunks out,
 * the read the compute waits for finished together with the prefetch
 * queued behind it, and the disk then idled while the compute ran
 * (bench/results/disk-window-20261207-130631.md). */
#define SL_DISK_DEFAULT_WINDOW (4u << 20)
#define SL_DISK_MAX_REQUESTS 1024        /* requests outstanding at once */

typedef struct sl_disk_store sl_disk_store;

/* Zeroed fields take their defaults. */
typedef struct sl_disk_params {
	const char *dir;        /* the offload directory; must exist */
	const char *file_name;  /* e.g. "opt-1.3b.sluice"; no '/' */
	const char *key;        /* text naming the model and layout; stored in
	                           the header and compared on open */
	uint64_t data_bytes;    /* capacity of the data area (rounded up to
	                           4 KiB) */
	int queue_depth;        /* chunks in flight; 0: 32, at most 4096 */
	size_t chunk_bytes;     /* request split size; 0: 1 MiB; a multiple of
	                           4 KiB, at most 64 MiB */
	size_t window_bytes;    /* bytes of chunks in flight at most (one chunk
	                           always may be); 0: SL_DISK_DEFAULT_WINDOW */
	bool force_fallback;    /* tests: act as if io_uring were unavailable */
	bool force_no_direct;   /* tests: act as if O_DIRECT were refused */
	bool bind_io;           /* bind the I/O threads to NUMA node io_node;
	                           false: leave them where the scheduler puts them */
	int io_node;            /* with bind_io: the kernel's node number; < 0:
	                           no binding (sl_topo_io_node's "no choice") */
	int test_header_delay_ms; /* tests: each header write lasts this much
	                             longer, as a slow sync would */
} sl_disk_params;

typedef struct sl_disk_stats {
	uint64_t bytes_read, bytes_written; /* completed successfully */
	uint64_t reads, writes;             /* requests completed (any status) */
	uint64_t requeued;                  /* requests that waited for a free slot */
	int max_in_flight;                  /* most chunks in flight at once */
	uint64_t max_in_flight_bytes;       /* and most bytes */
	double busy_s;                      /* seconds with >= 1 request unfinished */
} sl_disk_stats;

/*
 * Open DIR/FILE_NAME, creating it if missing.  *fresh is set true when the
 * caller must (re)write the data area: a new file, or a store whose writing
 * never completed; false for a complete store with the same key and size.
 * Errors: SL_ENOTFOUND (dir missing or not a directory), SL_EIO (dir not
 * writable, not enough free space, I/O error), SL_EINVAL (a store with
 * another key or size: remove it or use another --offload-dir; bad params),
 * SL_EFORMAT (not a sluice store, corrupt header, file shorter than its
 * header says).  On success the store owns its file; sl_disk_close frees it.
 */
int sl_disk_open(const sl_disk_params *p, sl_disk_store **out, bool *fresh);

/*
 * Queue a read of n bytes at data-area offset off into buf (or a write from
 * buf).  off, n and buf must be multiples of 4096 (SL_EINVAL) and the range
 * within the data area (SL_ERANGE).  *ticket identifies the request for
 * sl_disk_wait.  Blocks only while SL_DISK_MAX_REQUESTS requests are
 * outstanding.  Returns 0; the I/O status comes from the wait.  (SL_EIO here
 * only when over SL_DISK_MAX_REQUESTS failed requests were never waited
 * for: their failures are all kept until reported.)
 */
int sl_disk_read(sl_disk_store *s, uint64_t off, void *buf, size_t n, uint64_t *ticket);
int sl_disk_write(sl_disk_store *s, uint64_t off, const void *buf, size_t n, uint64_t *ticket);

/*
 * Wait for the request with this ticket and return its status: 0, or SL_EIO
 * with a message such as "short read at offset X of FILE (got N of M bytes):
 * truncated store?" or "FILE: disk full writing offset X (No space left on
 * device)".  Waiting for a ticket that already completed returns at once (its
 * error, if it failed and was not yet reported, however many requests were
 * issued since).  SL_EINVAL for a ticket never issued.
 */
int sl_disk_wait(sl_disk_store *s, uint64_t ticket);

/* Wait for every request issued so far; returns the first failure's status
 * (by ticket order) and forgets all failures. */
int sl_disk_wait_all(sl_disk_store *s);

/*
 * Declare the data area fully written: waits for all requests, refuses
 * (SL_EIO) if any write failed since open or the file is shorter than the
 * data area, then fdatasync()s the data and writes the header's complete
 * flag (and syncs it).
 */
int sl_disk_mark_complete(sl_disk_store *s);

/* A store's header, read without opening it for I/O (sluice convert --list). */
typedef struct sl_disk_info {
	uint32_t version;
	char key[SL_DISK_MAX_KEY + 1];
	uint64_t data_bytes, file_bytes;
	bool complete;       /* marked complete, and the file holds the data area */
	bool in_use;         /* an open store holds it (sl_disk_open's lock) */
	bool is_store;       /* a sluice store's magic (any version), or an empty
				file (a store whose creation was cut short) */
} sl_disk_info;

/*
 * Read the header of the store file at path.  SL_ENOTFOUND: no such file;
 * SL_EFORMAT: not a sluice store, a corrupt header or another format
 * version (info->version says which).
 */
int sl_disk_peek(const char *path, sl_disk_info *info);

/*
 * Remove the store file at path unless a process holds it open (every open
 * store holds a shared flock on its file until closed): *removed says
 * whether it went.  Removing never harms a process that has the file open:
 * it keeps reading its copy until it closes it.
 */
int sl_disk_remove_unused(const char *path, bool *removed);

/* Wait for requests in flight, stop the engine, close the file.  NULL ok. */
void sl_disk_close(sl_disk_store *s);

/* "io_uring+O_DIRECT", "threads+pread+O_DIRECT" or "threads+pread+buffered". */
const char *sl_disk_mode(const sl_disk_store *s);
/* The store file's path. */
const char *sl_disk_path(const sl_disk_store *s);
/* The data area's capacity in bytes (data_bytes rounded up to 4 KiB). */
uint64_t sl_disk_capacity(const sl_disk_store *s);
/* The NUMA node holding the CPU binding of the store's I/O threads, as
 * each thread read it back after binding itself at open (bind_io); -1
 * without bind_io, or where they span several nodes. */
int sl_disk_io_node(const sl_disk_store *s);
/* Counters since open; busy_s includes the current busy period. */
void sl_disk_get_stats(sl_disk_store *s, sl_disk_stats *out);

/*
 * Measure sequential O_DIRECT read bandwidth in dir: writes a temporary
 * (already unlinked) file of bytes (rounded up to 1 MiB, at least 1 MiB),
 * then reads it back through the same engine as a store (io_uring, 32 chunks
 * of 1 MiB in flight, fed by 16 MiB requests; or the fallback), and reports
 * GB/s (1e9 bytes/s) and the engine's name in mode.  No warning is printed;
 * mode tells which path ran.  Errors as sl_disk_open for the directory.
 */
int sl_disk_probe_read(const char *dir, uint64_t bytes, double *gbps, char *mode, size_t mode_len);

/*
 * The same, and the sequential O_DIRECT write rate of the pass that fills
 * the file: requests of the engine's chunk (1 MiB: the I/O a KV cache or
 * weights' store write reaches the device as, larger requests split into
 * chunks), 64 outstanding, timed from the first to the completion of the
 * last (no sync: the KV cache's writes are never synced).  write_gbps may
 * be NULL.
 */
int sl_disk_probe(const char *dir, uint64_t bytes, double *read_gbps, double *write_gbps, char *mode,
		  size_t mode_len);

/*
 * The probe file sluice profile runs its request patterns on: an unlinked
 * temporary file of bytes (rounded up to 1 MiB, at least 1 MiB) in dir,
 * written whole through a store's engine as sl_disk_probe writes it
 * (*write_gbps, may be NULL), synced and its page cache dropped.  Errors as
 * sl_disk_probe.  sl_disk_probe_close frees it (NULL ok).
 */
typedef struct sl_disk_probe_file sl_disk_probe_file;
int sl_disk_probe_open(const char *dir, uint64_t bytes, double *write_gbps, sl_disk_probe_file **out);

/*
 * One pass over the probe file: len bytes (a multiple of 4 KiB) in
 * requests of req bytes (the last may be shorter), reads or writes, the
 * first at off; each next request starts stride bytes after the one
 * before (0: right after it), the offsets wrapping within the file.  At
 * most nout (1 to 256) requests are outstanding: the oldest is waited for
 * before another is issued, as the weights' prefetch or the KV cache's
 * page writes keep them.  *seconds: from the first issue to the last
 * completion.  SL_EINVAL for a bad shape, else the store's errors.
 */
int sl_disk_probe_pass(sl_disk_probe_file *f, bool write, uint64_t off, uint64_t len, size_t req, int nout,
		       uint64_t stride, double *seconds);
/* The engine's name (sl_disk_mode's) and the file's size. */
const char *sl_disk_probe_engine(const sl_disk_probe_file *f);
uint64_t sl_disk_probe_bytes(const sl_disk_probe_file *f);
void sl_disk_probe_close(sl_disk_probe_file *f);

#endif
