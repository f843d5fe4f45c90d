/*
 * disk_internal.h - what the parts of the disk store share; not for callers
 * outside offload/disk_*.c (they use disk_store.h).
 *
 * The parts, one job each:
 *   disk_store.c     open, close, mark complete, remove: the file, its lock,
 *                    the checks before I/O, and the choice of engine
 *   disk_format.c    the on-disk header: encoding, checks, sl_disk_peek
 *   disk_requests.c  the request table (tickets, slots, chunks in order),
 *                    failure bookkeeping, read/write/wait, the statistics
 *   disk_uring.c     the io_uring engine (completion thread)
 *   disk_pool.c      the thread-pool engine (pread/pwrite)
 *   disk_probe.c     sl_disk_probe, the write and read bandwidth measurement
 *
 * Locking: s->mu guards the request table, the accounting and the engines'
 * queues; functions marked "mutex held" expect it held.
 */
#ifndef SL_DISK_INTERNAL_H
#define SL_DISK_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strerror_r returning the text, sync_file_range, O_DIRECT */
#endif
#include "disk_store.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

/* ---- requests (disk_requests.c) ------------------------------------------- */

enum { REQ_FREE = 0, REQ_ACTIVE, REQ_FAILED };

/* What went wrong with a request, kept until a wait reports it. */
typedef struct disk_fail {
	uint64_t ticket;
	bool write;
	bool is_short;  /* a read that hit the end of the file */
	int err;        /* positive errno (0 for a short read) */
	uint64_t pos;   /* data-area offset where the failing chunk stopped */
	uint64_t off;   /* the request */
	size_t len, got;
} disk_fail;

typedef struct disk_req {
	uint64_t ticket;
	int state;
	bool write;
	char *buf;
	uint64_t off;
	size_t len;
	size_t submitted; /* bytes handed to the engine (all of them once failed) */
	size_t done;      /* bytes transferred */
	int chunks_out;   /* chunks in the engine */
	bool failed;
	disk_fail fail;
} disk_req;

/*
 * An I/O engine: moves the chunks that disk_next_chunk hands out and reports
 * each with disk_chunk_finish.  Set in s->eng by its start function once it
 * holds anything to release.
 */
typedef struct disk_engine {
	void (*kick)(sl_disk_store *s);    /* mutex held: new chunks are waiting */
	void (*stop)(sl_disk_store *s);    /* no request active: join the threads */
	void (*release)(sl_disk_store *s); /* after stop: free the engine's state */
} disk_engine;

struct sl_disk_store {
	char *dir, *path, *key;
	uint64_t capacity;  /* data area */
	uint64_t hdr_bytes; /* SL_DISK_HEADER_BYTES; 0 for the probe file */
	int fd;
	bool direct;
	const char *mode;
	int qd;
	size_t chunk;
	size_t window;      /* bytes of chunks in flight at most (one always) */
	bool complete_on_disk; /* the header's flag as last written or read */
	bool write_failed;     /* since open: mark_complete refuses */
	int header_delay_ms;   /* sl_disk_params.test_header_delay_ms */

	pthread_mutex_t mu;
	pthread_cond_t done_cv;
	bool sync_init;
	disk_req *req; /* SL_DISK_MAX_REQUESTS */
	uint64_t next_ticket, sub_ticket;
	int active_reqs; /* issued, not finished */
	int in_flight;   /* chunks in the engine */
	uint64_t in_flight_bytes; /* their bytes */
	bool closing;
	int fatal;       /* positive errno once the engine broke */
	disk_fail *evicted; /* failures whose slot was reused before a wait
			       reported them: SL_DISK_MAX_REQUESTS, unordered */
	int n_evicted;
	bool hdr_busy;   /* a thread is writing the header (mutex released) */
	sl_disk_stats st;
	double busy_t0;

	/* the engine */
	const disk_engine *eng;
	void *eng_state;

	/* placement of the I/O threads (bind_io) */
	int bind_node;     /* -1: leave them unbound */
	int threads_bound; /* threads that have bound themselves */
	int io_node;       /* the node they read back; -1: several, or none */
};

static inline const char *disk_errstr(int e, char *buf, size_t n)
{
	return strerror_r(e, buf, n); /* GNU: returns the text */
}

/* The next chunk to start, in ticket order, counted in flight; false when
 * none is waiting or the queue depth or the window is full (mutex held). */
bool disk_next_chunk(sl_disk_store *s, int *slot, uint64_t *off, size_t *len);
/* A chunk of len bytes left the engine having moved got bytes; pos is the
 * data offset where it stopped (mutex held). */
void disk_chunk_finish(sl_disk_store *s, int slot, size_t len, uint64_t pos, size_t got, int err, bool is_short);
/* The engine broke: fail every active request with err (mutex held). */
void disk_fail_all(sl_disk_store *s, int err);

/* ---- the file and the header (disk_format.c) ------------------------------- */

/* n bytes, zeroed, 4 KiB aligned (O_DIRECT); NULL when out of memory. */
void *disk_page_alloc(size_t n);
/* Write the header and sync it; 0 or -errno (ENOSPC for a short write). */
int disk_header_pwrite(sl_disk_store *s, bool complete);
/* The message for a failed header write of errno e; marks write_failed. */
int disk_header_error(sl_disk_store *s, int e);
/* disk_header_pwrite, its error reported, complete_on_disk updated. */
int disk_header_write(sl_disk_store *s, bool complete);
/* Check the header h of an existing file of size bytes; *fresh is set when
 * the data must be (re)written. */
int disk_header_check(sl_disk_store *s, const unsigned char *h, uint64_t size, bool *fresh);

/* ---- lifecycle (disk_store.c) ---------------------------------------------- */

sl_disk_store *disk_store_new(const char *dir, const char *name, const char *key, int qd, size_t chunk,
			      size_t window);
int disk_check_dir(const char *dir);
int disk_open_error(const sl_disk_store *s, int e);
int disk_space_check(sl_disk_store *s, uint64_t need, uint64_t allocated);
/* Choose and start the engine; why_direct is set when O_DIRECT was refused.
 * Unless quiet, a fallback prints one warning line. */
int disk_engine_start(sl_disk_store *s, bool force_fallback, const char *why_direct, bool quiet);
/* First thing an I/O thread does: bind itself to the store's node. */
void disk_io_thread_place(sl_disk_store *s);
/* Wait until the n threads started have placed themselves. */
void disk_io_threads_placed(sl_disk_store *s, int n);

/* ---- engines (disk_uring.c, disk_pool.c) ----------------------------------- */

/* Start the io_uring engine: 0 with s->eng set, or 0 with why filled in
 * (io_uring unavailable: nothing held), or an error. */
int disk_uring_start(sl_disk_store *s, char *why, size_t whyn);
/* Start the thread-pool engine. */
int disk_pool_start(sl_disk_store *s);

#endif
