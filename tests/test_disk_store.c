/*
 * test_disk_store.c - the disk tier (offload/disk_*.c) on every engine.
 *
 * Engines: io_uring+O_DIRECT (skipped, with the reason, where the kernel has
 * no io_uring), the thread pool with O_DIRECT (force_fallback) and the thread
 * pool buffered (force_no_direct, and for real on a ramfs mount that refuses
 * O_DIRECT).  Checked: round trips of random data at random offsets and
 * sizes with many requests in flight, queue-depth and
 * request-table exhaustion, reopening (fresh only when incomplete), a store
 * of another key or size, truncated stores (short reads, refused reopen), a
 * disk filling up (RLIMIT_FSIZE -> EFBIG in a child; ENOSPC on a 4 MiB tmpfs
 * in a private mount namespace), missing and unwritable directories,
 * io_uring refused by a seccomp filter, the fallback warnings, the
 * bandwidth probe, and the I/O threads bound to a NUMA node (bind_io; on a
 * made-up two-node machine in test_topology.c).
 *
 * The tests are grouped by what they need from the machine; argv[1] names
 * the group, and each group is its own meson test.  A group whose need is
 * missing here (io_uring, /dev/shm, a private mount namespace, a user to
 * drop root to, a seccomp filter, one NUMA node) exits 77 with the reason
 * on stderr, which meson reports as SKIP; inside a group nothing skips.
 *
 * Everything lives in a temporary directory under /tmp (and /dev/shm where it
 * exists), removed at the end.  About 700 MiB of I/O in all, ~5 s.
 *
 * SLUICE_DISK_BENCH=DIR test_disk_store bench measures the probe's read
 * GB/s and the store's for a 1 GiB sequential read through the API, in DIR.
 *
 * Over 800 lines on purpose: one suite run once per engine (meson runs
 * it with each engine's environment), so every check of the store sits
 * beside the engine switches and the fault injection helpers it uses.
 */
#include "disk_store.h"
#include "sl_common.h"
#include "topology.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static char tmp_root[256];
static char shm_root[256];
static bool have_uring;
static char uring_why[160];

/* ---- helpers -------------------------------------------------------------- */

enum eng { E_URING, E_THREADS_DIRECT, E_THREADS_BUFFERED, E_COUNT };
static const char *const eng_mode[E_COUNT] = { "io_uring+O_DIRECT", "threads+pread+O_DIRECT",
					       "threads+pread+buffered" };

static uint64_t rnd(uint64_t *st)
{
	uint64_t x = *st;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *st = x;
}

static void fill_random(void *buf, size_t n, uint64_t seed)
{
	uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1, *p = buf;
	for (size_t i = 0; i < n / 8; i++)
		p[i] = rnd(&st);
}

static void *page_buf(size_t n)
{
	void *p = NULL;
	ck_assert_msg(posix_memalign(&p, 4096, n) == 0, "4 KiB-aligned allocation of %zu bytes", n);
	memset(p, 0xa5, n);
	return p;
}

static void make_dir(char *out, size_t n, const char *root, const char *name)
{
	snprintf(out, n, "%s/%s", root, name);
	ck_assert_msg(mkdir(out, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", out, strerror(errno));
}

static void join_path(char *out, size_t n, const char *dir, const char *name)
{
	snprintf(out, n, "%s/%s", dir, name);
}

/* A folder of its own under tmp_root for test PREFIX on engine e. */
static void engine_dir(char *out, size_t n, const char *prefix, int e)
{
	char name[32];
	snprintf(name, sizeof name, "%s%d", prefix, e);
	make_dir(out, n, tmp_root, name);
}

static sl_disk_params params(const char *dir, const char *name, const char *key, uint64_t bytes, int e)
{
	return (sl_disk_params){ .dir = dir, .file_name = name, .key = key, .data_bytes = bytes,
				 .force_fallback = e == E_THREADS_DIRECT,
				 .force_no_direct = e == E_THREADS_BUFFERED };
}

/* stderr into a temporary file while a store opens, to check warnings. */
static int cap_fd = -1, saved_fd = -1;

static void capture_begin(void)
{
	char path[] = "/tmp/sl-disk-stderr-XXXXXX";
	fflush(stderr);
	cap_fd = mkstemp(path);
	ck_assert_msg(cap_fd >= 0, "mkstemp: %s", strerror(errno));
	unlink(path);
	saved_fd = dup(2);
	dup2(cap_fd, 2);
}

static void capture_end(char *out, size_t n)
{
	fflush(stderr);
	dup2(saved_fd, 2);
	close(saved_fd);
	lseek(cap_fd, 0, SEEK_SET);
	ssize_t k = read(cap_fd, out, n - 1);
	out[k > 0 ? k : 0] = 0;
	close(cap_fd);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Open with stderr captured; checks the warning each engine should print. */
static int open_checked(const sl_disk_params *p, int e, sl_disk_store **s, bool *fresh)
{
	char warn[2048];
	capture_begin();
	int rc = sl_disk_open(p, s, fresh);
	capture_end(warn, sizeof warn);
	if (rc < 0)
		return rc;
	ck_assert_str_eq(sl_disk_mode(*s), eng_mode[e]);
	if (e == E_URING) {
		ck_assert_msg(warn[0] == 0, "no warning on the io_uring path, got: %s", warn);
	} else {
		char want[512];
		snprintf(want, sizeof want, "sluice: warning: %s: %s; using %s", p->dir,
			 e == E_THREADS_DIRECT ? "io_uring disabled (force_fallback)" : "O_DIRECT disabled (force_no_direct)",
			 eng_mode[e]);
		ck_assert_msg(strstr(warn, want) && count_lines(warn) == 1,
			      "one warning line containing \"%s\", got: \"%s\"", want, warn);
	}
	return rc;
}

typedef struct ext {
	uint64_t off;
	size_t len;
} ext;

/* Cut [0, cap) into random extents (a quarter up to 3 MiB, the rest up to
 * 64 KiB, all multiples of 4 KiB) in random order; returns how many. */
static int partition(ext *out, uint64_t cap, uint64_t seed)
{
	uint64_t st = seed * 2654435761u + 7, off = 0;
	int n = 0;
	while (off < cap) {
		uint64_t r = rnd(&st);
		uint64_t pages = (r & 3) == 0 ? 1 + (r >> 8) % 768 : 1 + (r >> 8) % 16;
		size_t len = (size_t)SL_MIN(pages * 4096, cap - off);
		out[n++] = (ext){ off, len };
		off += len;
	}
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(rnd(&st) % (uint64_t)(i + 1));
		ext t = out[i];
		out[i] = out[j];
		out[j] = t;
	}
	return n;
}

/* Issue every extent as one request, all in flight, then wait for them in
 * a random order; every wait must succeed. */
static void move_all(sl_disk_store *s, bool write, char *buf, const ext *x, int n, uint64_t seed)
{
	uint64_t *tk = malloc(sizeof *tk * (size_t)n);
	int *order = malloc(sizeof *order * (size_t)n);
	ck_assert(tk && order);
	for (int i = 0; i < n; i++) {
		int rc = write ? sl_disk_write(s, x[i].off, buf + x[i].off, x[i].len, &tk[i])
			       : sl_disk_read(s, x[i].off, buf + x[i].off, x[i].len, &tk[i]);
		ck_assert_msg(rc == 0, "%s %zu at %llu queued: %s", write ? "write" : "read", x[i].len,
			      (unsigned long long)x[i].off, sl_errmsg());
		order[i] = i;
	}
	uint64_t st = seed + 99;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(rnd(&st) % (uint64_t)(i + 1));
		int t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (int i = 0; i < n; i++) {
		int k = order[i];
		int rc = sl_disk_wait(s, tk[k]);
		ck_assert_msg(rc == 0, "%s of %zu bytes at %llu succeeds: %s", write ? "write" : "read", x[k].len,
			      (unsigned long long)x[k].off, sl_errmsg());
	}
	free(tk);
	free(order);
}

/* Write all of src (random extents), wait; returns nothing, asserts. */
static void write_whole(sl_disk_store *s, char *src, uint64_t cap, uint64_t seed)
{
	ext *x = malloc(sizeof *x * (cap / 4096 + 1));
	int n = partition(x, cap, seed);
	move_all(s, true, src, x, n, seed);
	free(x);
}

static void read_whole_and_compare(sl_disk_store *s, const char *src, uint64_t cap, uint64_t seed)
{
	char *dst = page_buf(cap);
	ext *x = malloc(sizeof *x * (cap / 4096 + 1));
	int n = partition(x, cap, seed);
	move_all(s, false, dst, x, n, seed);
	ck_assert_msg(memcmp(src, dst, cap) == 0, "data read back equals the data written");
	free(x);
	free(dst);
}

/*
 * n requests of len bytes each way, none waited for until all are issued:
 * src written (the i-th request at piece i * stride mod n: a stride
 * coprime with n scrambles the order, 1 keeps it), wait_all; read back in
 * order into dst, each waited for; the data must round-trip.
 */
static void write_read_all(sl_disk_store *s, const char *src, char *dst, int n, size_t len, uint64_t stride)
{
	uint64_t *tk = malloc(sizeof *tk * (size_t)n);
	ck_assert(tk);
	for (int i = 0; i < n; i++) {
		const uint64_t off = ((uint64_t)i * stride) % (uint64_t)n * len;
		ck_assert_msg(sl_disk_write(s, off, src + off, len, &tk[i]) == 0, "%s", sl_errmsg());
	}
	ck_assert_msg(sl_disk_wait_all(s) == 0, "%s", sl_errmsg());
	for (int i = 0; i < n; i++)
		ck_assert_msg(sl_disk_read(s, (uint64_t)i * len, dst + (size_t)i * len, len, &tk[i]) == 0, "%s",
			      sl_errmsg());
	for (int i = 0; i < n; i++)
		ck_assert_msg(sl_disk_wait(s, tk[i]) == 0, "read %d: %s", i, sl_errmsg());
	ck_assert_msg(memcmp(src, dst, (size_t)n * len) == 0, "%d requests of %zu bytes round-trip", n, len);
	free(tk);
}

/* Run fn in a forked child (its own rlimits, uid, mount namespace); returns
 * its exit status: 0 pass, else failure (it printed why). */
static int run_child(int (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(fn(arg)); /* _exit: no sanitizer leak report from the copied process */
	int st;
	ck_assert(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define CHILD_CHECK(cond, ...)                                                 \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "test_disk_store child, line %d: ", __LINE__); \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, " [last error: %s]\n", sl_errmsg());   \
			return 1;                                              \
		}                                                              \
	} while (0)

/* A private mount namespace with fstype mounted on dir; false if impossible. */
static bool private_mount(const char *dir, const char *fstype, const char *opts)
{
	if (unshare(CLONE_NEWNS) != 0)
		return false;
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		return false;
	return mount("sluice-test", dir, fstype, 0, opts) == 0;
}

/* Become nobody where running as root (a read-only folder means nothing to
 * root); true when the process is not root afterwards. */
static bool drop_root(void)
{
	if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
			       setresuid(65534, 65534, 65534) != 0))
		return false;
	return geteuid() != 0;
}

/* ---- round trips ---------------------------------------------------------- */

/* _i: 0..2 an engine, in root; 3: /dev/shm with whatever engine it gets. */
static void roundtrip_at(int _i, const char *root)
{
	int e = _i < E_COUNT ? _i : E_URING;
	const uint64_t cap = 24 * MIB;
	char dir[512], name[32];
	snprintf(name, sizeof name, "rt%d", _i);
	make_dir(dir, sizeof dir, root, name);
	char *src = page_buf(cap);
	fill_random(src, cap, 1000 + (uint64_t)_i);

	sl_disk_params p = params(dir, "opt-test.sluice", "opt-test fp16 v1", cap, e);
	p.queue_depth = 8;
	p.chunk_bytes = _i == 1 ? 0 : 256 * KIB; /* default 1 MiB once, else more splitting */
	sl_disk_store *s = NULL;
	bool fresh = false;
	if (_i == 3) {
		/* tmpfs took O_DIRECT in Linux 6.6; older kernels refuse it, and
		 * then the fallback must say so. */
		char warn[2048];
		capture_begin();
		int rc = sl_disk_open(&p, &s, &fresh);
		capture_end(warn, sizeof warn);
		ck_assert_msg(rc == 0, "open in /dev/shm: %s", sl_errmsg());
		if (strcmp(sl_disk_mode(s), "threads+pread+buffered") == 0)
			ck_assert_msg(strstr(warn, "refuses O_DIRECT") && count_lines(warn) == 1,
				      "tmpfs without O_DIRECT gives one warning line, got: %s", warn);
		else if (!have_uring)
			ck_assert_str_eq(sl_disk_mode(s), "threads+pread+O_DIRECT");
		else
			ck_assert_msg(warn[0] == 0, "no warning, got %s", warn);
		fprintf(stderr, "test_disk_store: /dev/shm uses %s\n", sl_disk_mode(s));
	} else {
		ck_assert_msg(open_checked(&p, e, &s, &fresh) == 0, "open: %s", sl_errmsg());
	}
	ck_assert_msg(fresh, "a new store is fresh");
	ck_assert_uint_eq(sl_disk_capacity(s), cap);

	char *dst = page_buf(cap);
	ext *x = malloc(sizeof *x * (cap / 4096));
	int n = partition(x, cap, 5 + (uint64_t)_i);
	move_all(s, true, src, x, n, 11);
	n = partition(x, cap, 77 + (uint64_t)_i);
	move_all(s, false, dst, x, n, 12);
	ck_assert_msg(memcmp(src, dst, cap) == 0, "data read back equals the data written");

	sl_disk_stats st;
	sl_disk_get_stats(s, &st);
	ck_assert_uint_eq(st.bytes_written, cap);
	ck_assert_uint_eq(st.bytes_read, cap);
	ck_assert_uint_eq(st.reads, (uint64_t)n);
	ck_assert_msg(st.busy_s > 0, "busy time is counted");
	ck_assert_msg(st.max_in_flight >= 2 && st.max_in_flight <= 8,
		      "several chunks in flight, at most the queue depth (8): %d", st.max_in_flight);
	/* the default window: 4 MiB, four of the default 1 MiB chunks */
	ck_assert_msg(st.max_in_flight_bytes <= SL_DISK_DEFAULT_WINDOW, "at most the window in flight: %llu bytes",
		      (unsigned long long)st.max_in_flight_bytes);
	if (_i == 1)
		ck_assert_msg(st.max_in_flight <= 4, "1 MiB chunks: at most 4 in the window, %d", st.max_in_flight);
	ck_assert_msg(sl_disk_mark_complete(s) == 0, "mark complete: %s", sl_errmsg());
	sl_disk_close(s);
	free(x);
	free(src);
	free(dst);
}

START_TEST(test_roundtrip)
{
	roundtrip_at(_i, tmp_root);
}
END_TEST

START_TEST(test_roundtrip_shm)
{
	roundtrip_at(3, shm_root);
}
END_TEST

/* ---- reopening -------------------------------------------------------- */

START_TEST(test_reopen)
{
	int e = _i;
	const uint64_t cap = 8 * MIB;
	char dir[512];
	engine_dir(dir, sizeof dir, "reopen", e);
	char *src = page_buf(cap);
	fill_random(src, cap, 42);
	sl_disk_params p = params(dir, "m.sluice", "opt-125m fp16 layout-a", cap, e);
	sl_disk_store *s;
	bool fresh;

	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && fresh);
	write_whole(s, src, cap, 1);
	sl_disk_close(s); /* never marked complete: an interrupted writer */

	ck_assert_msg(open_checked(&p, e, &s, &fresh) == 0, "reopen: %s", sl_errmsg());
	ck_assert_msg(fresh, "a store never marked complete is fresh again on reopen");
	write_whole(s, src, cap, 2);
	ck_assert_msg(sl_disk_mark_complete(s) == 0, "mark complete: %s", sl_errmsg());
	sl_disk_close(s);

	ck_assert_msg(open_checked(&p, e, &s, &fresh) == 0, "reopen: %s", sl_errmsg());
	ck_assert_msg(!fresh, "a complete store with the same key and size is not fresh");
	read_whole_and_compare(s, src, cap, 3);
	/* One more write clears the complete flag until marked again. */
	uint64_t t;
	ck_assert(sl_disk_write(s, 4096, src + 4096, 4096, &t) == 0 && sl_disk_wait(s, t) == 0);
	sl_disk_close(s);
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_msg(fresh, "a complete store written again and not re-marked is fresh");
	ck_assert(sl_disk_mark_complete(s) == 0);
	sl_disk_close(s);
	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && !fresh);
	read_whole_and_compare(s, src, cap, 4);
	sl_disk_close(s);

	/* Marking complete before the whole area was written is refused. */
	p.file_name = "half.sluice";
	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && fresh);
	ck_assert(sl_disk_write(s, 0, src, cap / 2, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert_int_eq(sl_disk_mark_complete(s), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "write the whole data area first"), "says why: %s", sl_errmsg());
	sl_disk_close(s);
	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && fresh);
	sl_disk_close(s);
	free(src);
}
END_TEST

START_TEST(test_key_mismatch)
{
	const uint64_t cap = 1 * MIB;
	char dir[512], path[600];
	make_dir(dir, sizeof dir, tmp_root, "key");
	char *src = page_buf(cap);
	fill_random(src, cap, 3);
	sl_disk_params p = params(dir, "model.sluice", "opt-1.3b fp16 layout v1", cap, E_THREADS_DIRECT);
	p.force_fallback = !have_uring;
	sl_disk_store *s;
	bool fresh;
	capture_begin();
	int rc = sl_disk_open(&p, &s, &fresh);
	char warn[1024];
	capture_end(warn, sizeof warn);
	ck_assert_msg(rc == 0, "open: %s", sl_errmsg());
	write_whole(s, src, cap, 9);
	ck_assert(sl_disk_mark_complete(s) == 0);
	sl_disk_close(s);
	join_path(path, sizeof path, dir, "model.sluice");

	sl_disk_params q = p;
	q.key = "opt-6.7b fp16 layout v1";
	s = (sl_disk_store *)1;
	ck_assert_int_eq(sl_disk_open(&q, &s, &fresh), SL_EINVAL);
	ck_assert_msg(s == NULL, "no store is handed out on failure");
	const char *m = sl_errmsg();
	ck_assert_msg(strstr(m, path) && strstr(m, "\"opt-1.3b fp16 layout v1\"") &&
			      strstr(m, "\"opt-6.7b fp16 layout v1\"") && strstr(m, "remove it") &&
			      strstr(m, "--offload-dir"),
		      "names the file, both keys and the way out: %s", m);

	q = p;
	q.data_bytes = 2 * MIB;
	ck_assert_int_eq(sl_disk_open(&q, &s, &fresh), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "2097152"), "names the expected size: %s", sl_errmsg());

	/* A damaged header: flip one key byte, the checksum catches it. */
	int fd = open(path, O_RDWR);
	ck_assert(fd >= 0);
	char c;
	ck_assert(pread(fd, &c, 1, 70) == 1);
	c ^= 1;
	ck_assert(pwrite(fd, &c, 1, 70) == 1);
	close(fd);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "checksum") && strstr(sl_errmsg(), path), "corrupt header: %s", sl_errmsg());

	/* Not a store at all; a file too short to be one. */
	join_path(path, sizeof path, dir, "junk.sluice");
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	ck_assert(fd >= 0 && write(fd, src, 8192) == 8192);
	close(fd);
	p.file_name = "junk.sluice";
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "not a sluice store"), "bad magic: %s", sl_errmsg());
	ck_assert(truncate(path, 100) == 0);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "too short"), "100-byte file: %s", sl_errmsg());
	free(src);
}
END_TEST

START_TEST(test_bad_params)
{
	char dir[512];
	make_dir(dir, sizeof dir, tmp_root, "params");
	sl_disk_store *s;
	bool fresh;
	sl_disk_params p = params(dir, "a/b.sluice", "k", MIB, E_THREADS_DIRECT);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	p = params(dir, "b.sluice", NULL, MIB, E_THREADS_DIRECT);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	p = params(dir, "b.sluice", "k", 0, E_THREADS_DIRECT);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	p = params(dir, "b.sluice", "k", MIB, E_THREADS_DIRECT);
	p.queue_depth = -1;
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	p.queue_depth = 0;
	p.chunk_bytes = 1000;
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	char longkey[SL_DISK_MAX_KEY + 2];
	memset(longkey, 'k', sizeof longkey - 1);
	longkey[sizeof longkey - 1] = 0;
	p = params(dir, "b.sluice", longkey, MIB, E_THREADS_DIRECT);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EINVAL);
	sl_disk_close(NULL);
}
END_TEST

/* Bad offsets, sizes, buffers, tickets; capacity rounding. */
START_TEST(test_bad_args)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "args", e);
	sl_disk_params p = params(dir, "a.sluice", "k", MIB - 100, e);
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_uint_eq(sl_disk_capacity(s), MIB);
	char *buf = page_buf(2 * MIB);
	uint64_t t = 0;
	ck_assert_int_eq(sl_disk_read(s, 100, buf, 4096, &t), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "multiples of 4096"), "%s", sl_errmsg());
	ck_assert_int_eq(sl_disk_read(s, 0, buf, 100, &t), SL_EINVAL);
	ck_assert_int_eq(sl_disk_write(s, 0, buf + 512, 4096, &t), SL_EINVAL);
	ck_assert_int_eq(sl_disk_write(s, 0, buf, 0, &t), SL_EINVAL);
	ck_assert_int_eq(sl_disk_read(s, MIB - 4096, buf, 8192, &t), SL_ERANGE);
	ck_assert_int_eq(sl_disk_read(s, 2 * MIB, buf, 4096, &t), SL_ERANGE);
	ck_assert_int_eq(sl_disk_wait(s, 0), SL_EINVAL);
	ck_assert_int_eq(sl_disk_wait(s, 12345), SL_EINVAL);
	ck_assert(sl_disk_wait_all(s) == 0);
	/* Still works after all that. */
	fill_random(buf, MIB, 8);
	ck_assert(sl_disk_write(s, 0, buf, MIB, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert(sl_disk_read(s, 0, buf + MIB, MIB, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert(memcmp(buf, buf + MIB, MIB) == 0);
	ck_assert_int_eq(sl_disk_wait(s, t), 0); /* waiting again is fine */
	sl_disk_close(s);
	free(buf);
}
END_TEST

/* ---- queue depth and request-table exhaustion ----------------------------- */

START_TEST(test_queue_exhaustion)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "qd", e);
	const int nreq = 3000; /* > SL_DISK_MAX_REQUESTS, >> queue depth */
	const uint64_t cap = (uint64_t)nreq * 4096;
	sl_disk_params p = params(dir, "q.sluice", "k", cap, e);
	p.queue_depth = 2;
	p.chunk_bytes = 4096;
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 17);
	write_read_all(s, src, dst, nreq, 4096, 1237); /* the writes in a scrambled page order */
	sl_disk_stats st;
	sl_disk_get_stats(s, &st);
	ck_assert_msg(st.max_in_flight <= 2, "never more than the queue depth in flight: %d", st.max_in_flight);
	ck_assert_msg(st.requeued > 0, "requests beyond the request table waited for a slot");
	ck_assert_uint_eq(st.reads, (uint64_t)nreq);
	ck_assert_uint_eq(st.writes, (uint64_t)nreq);
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/*
 * The window: however deep the queue, no more bytes in flight than it holds,
 * so that requests finish in the order they were issued; a chunk larger
 * than the window still goes, alone.  _i: the engine.
 */
START_TEST(test_window)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "win", e);
	const uint64_t cap = 2 * MIB;
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 29);
	/* {window, chunk}: three chunks' worth; half a chunk */
	const size_t shape[2][2] = { { 3 * 64 * KIB, 64 * KIB }, { 32 * KIB, 64 * KIB } };
	for (int k = 0; k < 2; k++) {
		sl_disk_params p = params(dir, k ? "w1.sluice" : "w3.sluice", "k", cap, e);
		p.queue_depth = 32;
		p.window_bytes = shape[k][0];
		p.chunk_bytes = shape[k][1];
		sl_disk_store *s;
		bool fresh;
		ck_assert_msg(open_checked(&p, e, &s, &fresh) == 0, "open: %s", sl_errmsg());
		write_read_all(s, src, dst, 4, cap / 4, 1); /* 512 KiB requests */
		sl_disk_stats st;
		sl_disk_get_stats(s, &st);
		if (k == 0)
			ck_assert_msg(st.max_in_flight >= 2 && st.max_in_flight <= 3 &&
					      st.max_in_flight_bytes <= shape[k][0],
				      "a window of 3 chunks: %d chunks, %llu bytes in flight at most",
				      st.max_in_flight, (unsigned long long)st.max_in_flight_bytes);
		else
			ck_assert_msg(st.max_in_flight == 1 && st.max_in_flight_bytes == shape[k][1],
				      "a chunk larger than the window goes alone: %d chunks, %llu bytes",
				      st.max_in_flight, (unsigned long long)st.max_in_flight_bytes);
		sl_disk_close(s);
		memset(dst, 0, cap);
	}
	free(src);
	free(dst);
}
END_TEST

/* The VmFlags of the mapping that holds p (/proc/self/smaps) into flags. */
static bool vm_flags(const void *p, char *flags, size_t n)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return false;
	char line[512];
	bool in = false, found = false;
	while (!found && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
		else if (in && !strncmp(line, "VmFlags:", 8))
			found = snprintf(flags, n, "%s", line + 8) > 0;
	}
	fclose(f);
	return found;
}

/*
 * sl_io_alloc, the disk tier's buffers: page aligned below 2 MiB; from
 * 2 MiB up aligned to 2 MiB and advised as transparent huge pages (the
 * mapping's VmFlags carry "hg"), where the kernel offers them.
 */
START_TEST(test_io_alloc)
{
	const size_t sizes[] = { 1, 4096, 100000, (size_t)2 << 20, (size_t)5 << 20 };
	char thp[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (f) {
		if (!fgets(thp, sizeof thp, f))
			thp[0] = 0;
		thp[strcspn(thp, "\n")] = 0;
		fclose(f);
	}
	const bool offered = thp[0] && !strstr(thp, "[never]");
	for (size_t i = 0; i < SL_ARRAY_LEN(sizes); i++) {
		char *p = sl_io_alloc(sizes[i]);
		ck_assert_msg(p, "sl_io_alloc(%zu)", sizes[i]);
		const bool big = sizes[i] >= ((size_t)2 << 20);
		const uintptr_t align = big ? (uintptr_t)2 << 20 : 4096;
		ck_assert_msg((uintptr_t)p % align == 0, "%zu bytes at %p: aligned to %lu", sizes[i], (void *)p,
			      (unsigned long)align);
		memset(p, 1, (sizes[i] + 4095) & ~(size_t)4095); /* a whole number of pages is usable */
		char fl[256];
		if (big && offered) {
			ck_assert_msg(vm_flags(p, fl, sizeof fl), "the mapping of %p in /proc/self/smaps", (void *)p);
			ck_assert_msg(strstr(fl, " hg"), "%zu bytes advised as huge pages (THP %s): VmFlags%s",
				      sizes[i], thp, fl);
		}
		free(p);
	}
}
END_TEST

/* I/O goes on while the caller does not call into the store (the scheduler
 * computes meanwhile): only sl_disk_get_stats is polled, and it drives
 * nothing. */
START_TEST(test_background_progress)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "bg", e);
	const uint64_t cap = 16 * MIB;
	sl_disk_params p = params(dir, "bg.sluice", "k", cap, e);
	p.queue_depth = 2;
	p.chunk_bytes = 128 * KIB; /* 128 chunks, 2 at a time */
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 61);
	uint64_t tw, tr;
	ck_assert(sl_disk_write(s, 0, src, cap, &tw) == 0);
	sl_disk_stats st;
	double t0 = sl_now();
	do {
		usleep(2000);
		sl_disk_get_stats(s, &st);
	} while (st.bytes_written < cap && sl_now() - t0 < 30);
	ck_assert_msg(st.bytes_written == cap, "the whole write completed without a wait call (%llu bytes)",
		      (unsigned long long)st.bytes_written);
	ck_assert(sl_disk_read(s, 0, dst, cap, &tr) == 0);
	do {
		usleep(2000);
		sl_disk_get_stats(s, &st);
	} while (st.bytes_read < cap && sl_now() - t0 < 30);
	ck_assert_msg(st.bytes_read == cap, "the whole read completed without a wait call");
	ck_assert(sl_disk_wait(s, tw) == 0 && sl_disk_wait(s, tr) == 0);
	ck_assert(memcmp(src, dst, cap) == 0);
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/* Several caller threads on one store, each on its own region. */
typedef struct mt_arg {
	sl_disk_store *s;
	char *src, *dst;
	uint64_t base, len;
	int fails;
} mt_arg;

static void *mt_worker(void *vp)
{
	mt_arg *a = vp;
	uint64_t tk[16];
	for (int round = 0; round < 2; round++) {
		bool write = round == 0;
		char *buf = write ? a->src : a->dst;
		uint64_t piece = a->len / 16;
		for (int i = 0; i < 16; i++) {
			uint64_t off = a->base + (uint64_t)i * piece;
			int rc = write ? sl_disk_write(a->s, off, buf + off, piece, &tk[i])
				       : sl_disk_read(a->s, off, buf + off, piece, &tk[i]);
			a->fails += rc != 0;
		}
		for (int i = 15; i >= 0; i--)
			a->fails += sl_disk_wait(a->s, tk[i]) != 0;
	}
	return NULL;
}

START_TEST(test_threads)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "mt", e);
	const uint64_t cap = 16 * MIB;
	sl_disk_params p = params(dir, "mt.sluice", "k", cap, e);
	p.queue_depth = 4;
	p.chunk_bytes = 64 * KIB;
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 71);
	pthread_t th[4];
	mt_arg a[4];
	for (int i = 0; i < 4; i++) {
		a[i] = (mt_arg){ .s = s, .src = src, .dst = dst, .base = (uint64_t)i * cap / 4, .len = cap / 4 };
		ck_assert(pthread_create(&th[i], NULL, mt_worker, &a[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(a[i].fails == 0, "thread %d: every call succeeds", i);
	}
	ck_assert(memcmp(src, dst, cap) == 0);
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/* bind_io: every engine's threads bind themselves to the node asked for
 * before open returns and read it back; without bind_io (zeroed params,
 * today's behaviour) nothing is bound and the store reports -1. */
START_TEST(test_io_node)
{
	int e = _i;
	char dir[512];
	engine_dir(dir, sizeof dir, "numa", e);
	sl_disk_params p = params(dir, "n.sluice", "k", MIB, e);
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_int_eq(sl_disk_io_node(s), -1);
	sl_disk_close(s);

	const int node = sl_topo_io_node(NULL); /* the node holding this process */
	ck_assert_int_ge(node, 0);              /* the group's need, checked in main */
	p.bind_io = true;
	p.io_node = node;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_int_eq(sl_disk_io_node(s), node);
	char *src = page_buf(MIB), *dst = page_buf(MIB);
	fill_random(src, MIB, 5);
	uint64_t t;
	ck_assert(sl_disk_write(s, 0, src, MIB, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert(sl_disk_read(s, 0, dst, MIB, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert(memcmp(src, dst, MIB) == 0);
	sl_disk_close(s);

	p.io_node = -1; /* sl_topo_io_node's "no choice": nothing bound */
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_int_eq(sl_disk_io_node(s), -1);
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/* ---- truncated stores ----------------------------------------------------- */

START_TEST(test_truncated)
{
	int e = _i;
	const uint64_t cap = 4 * MIB;
	char dir[512], name[32], path[600], want[800];
	snprintf(name, sizeof name, "trunc%d", e);
	make_dir(dir, sizeof dir, tmp_root, name);
	join_path(path, sizeof path, dir, "t.sluice");
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 23);
	sl_disk_params p = params(dir, "t.sluice", "k", cap, e);
	p.chunk_bytes = 256 * KIB;
	sl_disk_store *s;
	bool fresh;
	uint64_t t;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	write_whole(s, src, cap, 5);

	/* Cut at a page boundary, 1 MiB into the data. */
	ck_assert(truncate(path, SL_DISK_HEADER_BYTES + 1 * MIB) == 0);
	ck_assert(sl_disk_read(s, 512 * KIB, dst, 2 * MIB, &t) == 0);
	ck_assert_int_eq(sl_disk_wait(s, t), SL_EIO);
	snprintf(want, sizeof want, "short read at offset 524288 of %s (got 524288 of 2097152 bytes): truncated store?",
		 path);
	ck_assert_msg(strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	ck_assert_msg(memcmp(dst, src + 512 * KIB, 512 * KIB) == 0, "the bytes before the end were read");
	ck_assert_int_eq(sl_disk_wait(s, t), 0); /* reported once */

	/* Cut mid-page: O_DIRECT returns the odd tail, and it is still short. */
	write_whole(s, src, cap, 6);
	ck_assert(truncate(path, SL_DISK_HEADER_BYTES + 3 * MIB + 100) == 0);
	ck_assert(sl_disk_read(s, 3 * MIB, dst, MIB, &t) == 0);
	ck_assert_int_eq(sl_disk_wait(s, t), SL_EIO);
	snprintf(want, sizeof want, "short read at offset 3145728 of %s (got 100 of 1048576 bytes): truncated store?",
		 path);
	ck_assert_msg(strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	/* A read inside what is left still works; so does wait_all's report. */
	ck_assert(sl_disk_read(s, 0, dst, 3 * MIB, &t) == 0 && sl_disk_wait(s, t) == 0);
	ck_assert(memcmp(dst, src, 3 * MIB) == 0);
	ck_assert(sl_disk_read(s, 2 * MIB, dst, 2 * MIB, &t) == 0);
	ck_assert_int_eq(sl_disk_wait_all(s), SL_EIO);
	ck_assert_msg(strstr(sl_errmsg(), "short read at offset 2097152"), "%s", sl_errmsg());
	sl_disk_close(s);

	/* A complete store cut afterwards is refused on reopen. */
	p.file_name = "c.sluice";
	join_path(path, sizeof path, dir, "c.sluice");
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	write_whole(s, src, cap, 7);
	ck_assert(sl_disk_mark_complete(s) == 0);
	sl_disk_close(s);
	ck_assert(truncate(path, SL_DISK_HEADER_BYTES + 2 * MIB) == 0);
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_EFORMAT);
	ck_assert_msg(strstr(sl_errmsg(), "is truncated") && strstr(sl_errmsg(), path), "%s", sl_errmsg());
	free(src);
	free(dst);
}
END_TEST

/* ---- failures reported after their slot is reused --------------------------- */

/*
 * Two failed requests, never waited for, then a whole request table of
 * good ones: both slots are reused.  A wait for either failed ticket still
 * reports its own failure, once; the good ones report nothing.
 */
START_TEST(test_wait_after_reuse)
{
	int e = _i;
	const uint64_t cap = 4 * MIB;
	char dir[512], name[32], path[600], want[800];
	snprintf(name, sizeof name, "reuse%d", e);
	make_dir(dir, sizeof dir, tmp_root, name);
	join_path(path, sizeof path, dir, "r.sluice");
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 29);
	sl_disk_params p = params(dir, "r.sluice", "k", cap, e);
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	write_whole(s, src, cap, 3);
	ck_assert(truncate(path, SL_DISK_HEADER_BYTES + 1 * MIB) == 0);
	uint64_t bad[2], t;
	ck_assert(sl_disk_read(s, 2 * MIB, dst, 4096, &bad[0]) == 0);
	ck_assert(sl_disk_read(s, 3 * MIB, dst + 4096, 4096, &bad[1]) == 0);
	for (int i = 0; i < SL_DISK_MAX_REQUESTS + 2; i++) {
		ck_assert(sl_disk_read(s, (uint64_t)(i % 256) * 4096, dst + 2 * MIB, 4096, &t) == 0);
		ck_assert_msg(sl_disk_wait(s, t) == 0, "good read %d: %s", i, sl_errmsg());
	}
	ck_assert_msg(t > bad[1] + SL_DISK_MAX_REQUESTS, "both failed tickets' slots were reused");
	ck_assert_int_eq(sl_disk_wait(s, bad[1]), SL_EIO);
	snprintf(want, sizeof want, "short read at offset 3145728 of %s (got 0 of 4096 bytes): truncated store?", path);
	ck_assert_msg(strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	ck_assert_int_eq(sl_disk_wait(s, bad[0]), SL_EIO);
	snprintf(want, sizeof want, "short read at offset 2097152 of %s (got 0 of 4096 bytes): truncated store?", path);
	ck_assert_msg(strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	ck_assert_int_eq(sl_disk_wait(s, bad[0]), 0); /* reported once */
	ck_assert_int_eq(sl_disk_wait(s, bad[1]), 0);
	ck_assert_int_eq(sl_disk_wait_all(s), 0);

	/* The same, reported by wait_all: the first by ticket order, and the count. */
	ck_assert(sl_disk_read(s, 2 * MIB, dst, 4096, &bad[0]) == 0);
	ck_assert(sl_disk_read(s, 3 * MIB, dst + 4096, 4096, &bad[1]) == 0);
	for (int i = 0; i < SL_DISK_MAX_REQUESTS + 2; i++) {
		ck_assert(sl_disk_read(s, (uint64_t)(i % 256) * 4096, dst + 2 * MIB, 4096, &t) == 0);
		ck_assert(sl_disk_wait(s, t) == 0);
	}
	ck_assert_int_eq(sl_disk_wait_all(s), SL_EIO);
	ck_assert_msg(strstr(sl_errmsg(), "short read at offset 2097152") &&
			      strstr(sl_errmsg(), "(and 1 more failed requests)"),
		      "%s", sl_errmsg());
	ck_assert_int_eq(sl_disk_wait(s, bad[1]), 0); /* wait_all reported it */
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/* ---- the header's sync does not stall other requests ------------------------ */

typedef struct hdr_arg {
	sl_disk_store *s;
	char *buf;
	volatile int started;
	int rc;
} hdr_arg;

static void *hdr_writer(void *vp)
{
	hdr_arg *a = vp;
	uint64_t t;
	a->started = 1;
	a->rc = sl_disk_write(a->s, 0, a->buf, 4096, &t);
	if (!a->rc)
		a->rc = sl_disk_wait(a->s, t);
	return NULL;
}

/*
 * The first write to a complete store clears the header's flag and syncs it
 * before any data moves.  That sync (made to last 1.5 s here) must not hold
 * up the store's other requests: a read issued meanwhile completes at once.
 */
START_TEST(test_header_sync_unlocked)
{
	int e = _i;
	const uint64_t cap = 1 * MIB;
	char dir[512];
	engine_dir(dir, sizeof dir, "hdr", e);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 37);
	sl_disk_params p = params(dir, "h.sluice", "k", cap, e);
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && fresh);
	write_whole(s, src, cap, 4);
	ck_assert(sl_disk_mark_complete(s) == 0);
	sl_disk_close(s);

	p.test_header_delay_ms = 1500;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0 && !fresh);
	hdr_arg a = { .s = s, .buf = src };
	pthread_t th;
	ck_assert(pthread_create(&th, NULL, hdr_writer, &a) == 0);
	while (!a.started)
		usleep(1000);
	usleep(200 * 1000); /* the writer is inside the header's sync now */
	double t0 = sl_now();
	uint64_t t;
	ck_assert(sl_disk_read(s, cap / 2, dst, 4096, &t) == 0);
	ck_assert_msg(sl_disk_wait(s, t) == 0, "%s", sl_errmsg());
	const double dt = sl_now() - t0;
	pthread_join(th, NULL);
	ck_assert_msg(a.rc == 0, "the write: %s", sl_errmsg());
	ck_assert_msg(dt < 0.5, "a read during the header's sync took %.3f s (the sync takes 1.5 s)", dt);
	ck_assert(memcmp(dst, src + cap / 2, 4096) == 0);
	sl_disk_close(s);
	p.test_header_delay_ms = 0;
	ck_assert(open_checked(&p, e, &s, &fresh) == 0);
	ck_assert_msg(fresh, "the write cleared the complete flag on disk");
	sl_disk_close(s);
	free(src);
	free(dst);
}
END_TEST

/* ---- the disk filling up --------------------------------------------------- */

typedef struct full_arg {
	int e;
	char dir[512];
} full_arg;

/* Child: file size limit just past 1 MiB of data; SIGXFSZ ignored, so writes
 * beyond it fail with EFBIG like a full disk. */
static int child_efbig(void *vp)
{
	full_arg *a = vp;
	signal(SIGXFSZ, SIG_IGN);
	const uint64_t limit = SL_DISK_HEADER_BYTES + MIB + 8192;
	struct rlimit rl = { limit, limit };
	CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit: %s", strerror(errno));
	sl_disk_params p = params(a->dir, "f.sluice", "k", 4 * MIB, a->e);
	sl_disk_store *s;
	bool fresh;
	capture_begin();
	int rc = sl_disk_open(&p, &s, &fresh);
	char warn[1024];
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && fresh, "open");
	char *buf = page_buf(4 * MIB);
	uint64_t t[4];
	for (int i = 0; i < 4; i++)
		CHILD_CHECK(sl_disk_write(s, (uint64_t)i * MIB, buf + (size_t)i * MIB, MIB, &t[i]) == 0, "queue");
	CHILD_CHECK(sl_disk_wait(s, t[0]) == 0, "the first MiB fits");
	char want[800];
	snprintf(want, sizeof want, "%s: disk full writing offset %llu (File too large)", sl_disk_path(s),
		 (unsigned long long)(MIB + 8192));
	rc = sl_disk_wait(s, t[1]);
	CHILD_CHECK(rc == SL_EIO && strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	rc = sl_disk_wait(s, t[3]);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "disk full writing offset 3145728 (File too large)"),
		    "4th MiB: %s", sl_errmsg());
	/* More failing requests than the request table holds, none waited for. */
	for (int i = 0; i < SL_DISK_MAX_REQUESTS + 100; i++) {
		uint64_t tk;
		CHILD_CHECK(sl_disk_write(s, 2 * MIB + (uint64_t)(i % 256) * 4096, buf, 4096, &tk) == 0, "queue %d", i);
	}
	rc = sl_disk_wait_all(s);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "disk full writing offset") &&
			    strstr(sl_errmsg(), "more failed requests"),
		    "wait_all reports the failures: %s", sl_errmsg());
	CHILD_CHECK(sl_disk_wait_all(s) == 0, "failures are reported once");
	/* Failures are kept until reported: past two tables of them unreported,
	 * issuing is refused (saying why) until they are waited for. */
	int refused = -1;
	for (int i = 0; i < 3 * SL_DISK_MAX_REQUESTS && refused < 0; i++) {
		uint64_t tk;
		rc = sl_disk_write(s, 2 * MIB, buf, 4096, &tk);
		if (rc == 0)
			CHILD_CHECK(i < 2 * SL_DISK_MAX_REQUESTS + 1, "issue %d accepted", i);
		else
			refused = i;
	}
	CHILD_CHECK(refused == 2 * SL_DISK_MAX_REQUESTS && rc == SL_EIO && strstr(sl_errmsg(), "never waited for"),
		    "refused at issue %d: %s", refused, sl_errmsg());
	rc = sl_disk_wait_all(s);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "(and 2047 more failed requests)"), "all kept: %s",
		    sl_errmsg());
	uint64_t tk;
	CHILD_CHECK(sl_disk_write(s, 0, buf, 4096, &tk) == 0 && sl_disk_wait(s, tk) == 0, "issuing again");
	rc = sl_disk_mark_complete(s);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "not marked complete"), "mark_complete refuses: %s",
		    sl_errmsg());
	sl_disk_close(s);
	free(buf);
	return 0;
}

START_TEST(test_efbig)
{
	full_arg a = { .e = _i };
	char name[32];
	snprintf(name, sizeof name, "efbig%d", a.e);
	make_dir(a.dir, sizeof a.dir, tmp_root, name);
	ck_assert_int_eq(run_child(child_efbig, &a), 0);
	/* Without the limit: the store is there but incomplete, so fresh. */
	sl_disk_params p = params(a.dir, "f.sluice", "k", 4 * MIB, a.e);
	sl_disk_store *s;
	bool fresh = false;
	ck_assert(open_checked(&p, a.e, &s, &fresh) == 0);
	ck_assert_msg(fresh, "a store whose writing failed is not taken as complete");
	sl_disk_close(s);
}
END_TEST

/* Child: a 4 MiB tmpfs of its own; a store that cannot fit is refused at
 * open, one that fits fails with ENOSPC once another file ate the space. */
static int child_enospc(void *vp)
{
	full_arg *a = vp;
	CHILD_CHECK(private_mount(a->dir, "tmpfs", "size=4m"), "mount a tmpfs in a private namespace: %s",
		    strerror(errno));
	sl_disk_store *s;
	bool fresh;
	char warn[1024];
	sl_disk_params p = params(a->dir, "big.sluice", "k", 64 * MIB, a->e);
	capture_begin();
	int rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "not enough free space") && strstr(sl_errmsg(), a->dir),
		    "a store larger than the disk is refused at open: %s", sl_errmsg());
	char big[600];
	join_path(big, sizeof big, a->dir, "big.sluice");
	CHILD_CHECK(access(big, F_OK) != 0, "a failed open removes the file it created");

	p = params(a->dir, "f.sluice", "k", 2 * MIB, a->e);
	capture_begin();
	rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && fresh, "open");
	char filler[600];
	join_path(filler, sizeof filler, a->dir, "filler");
	int fd = open(filler, O_CREAT | O_WRONLY, 0644);
	CHILD_CHECK(fd >= 0, "filler");
	char *buf = page_buf(2 * MIB);
	while (write(fd, buf, 64 * 1024) > 0)
		;
	CHILD_CHECK(errno == ENOSPC, "the filler fills the disk: %s", strerror(errno));
	close(fd);
	uint64_t t[2];
	for (int i = 0; i < 2; i++)
		CHILD_CHECK(sl_disk_write(s, (uint64_t)i * MIB, buf + (size_t)i * MIB, MIB, &t[i]) == 0, "queue");
	rc = sl_disk_wait(s, t[0]);
	int rc1 = sl_disk_wait(s, t[1]);
	CHILD_CHECK(rc == SL_EIO || rc1 == SL_EIO, "a write fails");
	CHILD_CHECK(sl_disk_write(s, 0, buf, MIB, &t[0]) == 0, "queue");
	rc = sl_disk_wait(s, t[0]);
	char want[800];
	snprintf(want, sizeof want, "%s: disk full writing offset 0 (No space left on device)", sl_disk_path(s));
	CHILD_CHECK(rc == SL_EIO && strcmp(sl_errmsg(), want) == 0, "expected \"%s\", got \"%s\"", want, sl_errmsg());
	CHILD_CHECK(sl_disk_mark_complete(s) == SL_EIO, "mark_complete refuses");
	sl_disk_close(s);
	unlink(filler);
	capture_begin();
	rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && fresh, "after ENOSPC the store reopens as fresh");
	sl_disk_close(s);
	free(buf);
	return 0;
}

START_TEST(test_enospc)
{
	full_arg a = { .e = _i };
	char name[32];
	snprintf(name, sizeof name, "enospc%d", a.e);
	make_dir(a.dir, sizeof a.dir, tmp_root, name);
	int st = run_child(child_enospc, &a);
	ck_assert_msg(st == 0, "the ENOSPC child passed (status %d)", st);
}
END_TEST

/* ---- directories and file systems ------------------------------------------ */

static int child_unwritable(void *vp)
{
	full_arg *a = vp;
	CHILD_CHECK(drop_root(), "drop root to nobody: %s", strerror(errno));
	sl_disk_params p = params(a->dir, "u.sluice", "k", MIB, E_THREADS_DIRECT);
	sl_disk_store *s;
	bool fresh;
	int rc = sl_disk_open(&p, &s, &fresh);
	CHILD_CHECK(rc == SL_EIO && strstr(sl_errmsg(), "is not writable") && strstr(sl_errmsg(), a->dir) &&
			    strstr(sl_errmsg(), "Permission denied"),
		    "unwritable dir: %d %s", rc, sl_errmsg());
	return 0;
}

START_TEST(test_dirs)
{
	char dir[512], file[600];
	snprintf(dir, sizeof dir, "%s/no-such-dir", tmp_root);
	sl_disk_params p = params(dir, "m.sluice", "k", MIB, E_THREADS_DIRECT);
	sl_disk_store *s;
	bool fresh;
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_ENOTFOUND);
	ck_assert_msg(strstr(sl_errmsg(), dir) && strstr(sl_errmsg(), "does not exist"), "%s", sl_errmsg());
	double g;
	char mode[64];
	ck_assert_int_eq(sl_disk_probe_read(dir, MIB, &g, mode, sizeof mode), SL_ENOTFOUND);

	join_path(file, sizeof file, tmp_root, "plain-file");
	int fd = open(file, O_CREAT | O_WRONLY, 0644);
	ck_assert(fd >= 0);
	close(fd);
	p.dir = file;
	ck_assert_int_eq(sl_disk_open(&p, &s, &fresh), SL_ENOTFOUND);
	ck_assert_msg(strstr(sl_errmsg(), "not a directory"), "%s", sl_errmsg());
}
END_TEST

/* A folder the process cannot write to (as nobody where it runs as root). */
START_TEST(test_unwritable)
{
	full_arg a;
	make_dir(a.dir, sizeof a.dir, tmp_root, "readonly");
	ck_assert(chmod(a.dir, 0555) == 0);
	int st = run_child(child_unwritable, &a);
	ck_assert_msg(st == 0, "the unwritable-dir child passed (status %d)", st);
}
END_TEST

/* ramfs refuses O_DIRECT at open (EINVAL): the real fallback and its warning. */
static int child_ramfs(void *vp)
{
	full_arg *a = vp;
	CHILD_CHECK(private_mount(a->dir, "ramfs", NULL), "mount ramfs in a private namespace: %s",
		    strerror(errno));
	const uint64_t cap = 4 * MIB;
	sl_disk_params p = params(a->dir, "r.sluice", "k", cap, E_URING);
	sl_disk_store *s;
	bool fresh;
	char warn[2048], want[800];
	capture_begin();
	int rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && fresh, "open on ramfs");
	CHILD_CHECK(strcmp(sl_disk_mode(s), "threads+pread+buffered") == 0, "mode %s", sl_disk_mode(s));
	snprintf(want, sizeof want,
		 "sluice: warning: %s: the file system refuses O_DIRECT (Invalid argument); using threads+pread+buffered",
		 a->dir);
	CHILD_CHECK(strstr(warn, want) && count_lines(warn) == 1, "one warning \"%s\", got \"%s\"", want, warn);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 31);
	uint64_t t[4];
	for (int i = 0; i < 4; i++)
		CHILD_CHECK(sl_disk_write(s, (uint64_t)i * MIB, src + (size_t)i * MIB, MIB, &t[i]) == 0, "write");
	CHILD_CHECK(sl_disk_wait_all(s) == 0, "writes");
	for (int i = 0; i < 4; i++)
		CHILD_CHECK(sl_disk_read(s, (uint64_t)i * MIB, dst + (size_t)i * MIB, MIB, &t[i]) == 0, "read");
	for (int i = 3; i >= 0; i--)
		CHILD_CHECK(sl_disk_wait(s, t[i]) == 0, "read %d", i);
	CHILD_CHECK(memcmp(src, dst, cap) == 0, "ramfs round trip");
	CHILD_CHECK(sl_disk_mark_complete(s) == 0, "complete");
	sl_disk_close(s);
	capture_begin();
	rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && !fresh, "reopen complete on ramfs");
	sl_disk_close(s);
	double g;
	char mode[64];
	CHILD_CHECK(sl_disk_probe_read(a->dir, 2 * MIB, &g, mode, sizeof mode) == 0 &&
			    strcmp(mode, "threads+pread+buffered") == 0,
		    "probe on ramfs: %s", mode);
	free(src);
	free(dst);
	return 0;
}

START_TEST(test_ramfs_no_direct)
{
	full_arg a = { .e = E_URING };
	make_dir(a.dir, sizeof a.dir, tmp_root, "ramfs");
	int st = run_child(child_ramfs, &a);
	ck_assert_msg(st == 0, "the ramfs child passed (status %d)", st);
}
END_TEST

/* Child: io_uring_setup fails with EPERM, as under a container's seccomp
 * profile or kernel.io_uring_disabled; the real (unforced) fallback. */
static int child_no_uring(void *vp)
{
	full_arg *a = vp;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = (unsigned short)SL_ARRAY_LEN(f), .filter = f };
	CHILD_CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
			    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0,
		    "install a seccomp filter: %s", strerror(errno));
	const uint64_t cap = 2 * MIB;
	sl_disk_params p = params(a->dir, "n.sluice", "k", cap, E_URING);
	sl_disk_store *s;
	bool fresh;
	char warn[2048], want[800];
	capture_begin();
	int rc = sl_disk_open(&p, &s, &fresh);
	capture_end(warn, sizeof warn);
	CHILD_CHECK(rc == 0 && fresh, "open without io_uring");
	CHILD_CHECK(strcmp(sl_disk_mode(s), "threads+pread+O_DIRECT") == 0, "mode %s", sl_disk_mode(s));
	snprintf(want, sizeof want,
		 "sluice: warning: %s: io_uring is unavailable (io_uring_queue_init: Operation not permitted); "
		 "using threads+pread+O_DIRECT\n",
		 a->dir);
	CHILD_CHECK(strcmp(warn, want) == 0, "the warning \"%s\", got \"%s\"", want, warn);
	char *src = page_buf(cap), *dst = page_buf(cap);
	fill_random(src, cap, 51);
	uint64_t t;
	CHILD_CHECK(sl_disk_write(s, 0, src, cap, &t) == 0 && sl_disk_wait(s, t) == 0, "write");
	CHILD_CHECK(sl_disk_read(s, 0, dst, cap, &t) == 0 && sl_disk_wait(s, t) == 0, "read");
	CHILD_CHECK(memcmp(src, dst, cap) == 0, "round trip without io_uring");
	sl_disk_close(s);
	double g;
	char mode[64];
	CHILD_CHECK(sl_disk_probe_read(a->dir, 2 * MIB, &g, mode, sizeof mode) == 0 &&
			    strcmp(mode, "threads+pread+O_DIRECT") == 0,
		    "probe without io_uring: %s", mode);
	free(src);
	free(dst);
	return 0;
}

START_TEST(test_no_uring)
{
	full_arg a = { .e = E_URING };
	make_dir(a.dir, sizeof a.dir, tmp_root, "nouring");
	int st = run_child(child_no_uring, &a);
	ck_assert_msg(st == 0, "the no-io_uring child passed (status %d)", st);
}
END_TEST

/* Both fallbacks at once: O_DIRECT refused wins, one warning line. */
START_TEST(test_both_fallbacks)
{
	char dir[512];
	make_dir(dir, sizeof dir, tmp_root, "both");
	sl_disk_params p = params(dir, "b.sluice", "k", MIB, E_THREADS_BUFFERED);
	p.force_fallback = true;
	sl_disk_store *s;
	bool fresh;
	ck_assert(open_checked(&p, E_THREADS_BUFFERED, &s, &fresh) == 0);
	sl_disk_close(s);
}
END_TEST

START_TEST(test_probe)
{
	char dir[512], mode[64] = "";
	make_dir(dir, sizeof dir, tmp_root, "probe");
	double g = 0, w = 0;
	ck_assert_msg(sl_disk_probe(dir, 8 * MIB, &g, &w, mode, sizeof mode) == 0, "%s", sl_errmsg());
	ck_assert_msg(g > 0 && w > 0, "positive bandwidths: read %g, write %g", g, w);
	ck_assert_str_eq(mode, have_uring ? "io_uring+O_DIRECT" : "threads+pread+O_DIRECT");
	fprintf(stderr, "test_disk_store: probe in %s: read %.2f GB/s, write %.2f GB/s (%s, 8 MiB)\n", dir, g, w,
		mode);
	/* The probe leaves nothing behind. */
	DIR *d = opendir(dir);
	ck_assert(d);
	int n = 0;
	for (struct dirent *de; (de = readdir(d));)
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	closedir(d);
	ck_assert_msg(n == 0, "the probe file is gone (%d entries left)", n);

	/* the probe file and its passes (sluice profile's patterns) */
	sl_disk_probe_file *f = NULL;
	w = 0;
	ck_assert_msg(sl_disk_probe_open(dir, 3 * MIB + 1, &w, &f) == 0, "%s", sl_errmsg());
	ck_assert_msg(w > 0, "the fill's write rate %g", w);
	ck_assert_uint_eq(sl_disk_probe_bytes(f), 4 * MIB); /* rounded up to 1 MiB */
	ck_assert_str_eq(sl_disk_probe_engine(f), mode);
	double sec = 0;
	/* segment reads, two outstanding, past the end: they wrap */
	ck_assert_msg(sl_disk_probe_pass(f, false, 2 * MIB, 6 * MIB, MIB, 2, 0, &sec) == 0, "%s", sl_errmsg());
	ck_assert(sec > 0);
	/* a last request shorter than the others */
	ck_assert_msg(sl_disk_probe_pass(f, false, 0, 3 * MIB / 2, MIB, 1, 0, &sec) == 0, "%s", sl_errmsg());
	/* scattered page writes, many outstanding */
	ck_assert_msg(sl_disk_probe_pass(f, true, 4096, 64 * 4096, 4096, 32, 68 * 1024, &sec) == 0, "%s",
		      sl_errmsg());
	ck_assert(sec > 0);
	/* bad shapes */
	ck_assert_int_eq(sl_disk_probe_pass(f, false, 0, MIB, 1000, 1, 0, &sec), SL_EINVAL);
	ck_assert_int_eq(sl_disk_probe_pass(f, false, 0, MIB, MIB, 0, 0, &sec), SL_EINVAL);
	ck_assert_int_eq(sl_disk_probe_pass(f, false, 0, MIB, MIB, 257, 0, &sec), SL_EINVAL);
	ck_assert_int_eq(sl_disk_probe_pass(f, false, 0, MIB, 8 * MIB, 1, 0, &sec), SL_EINVAL);
	ck_assert_int_eq(sl_disk_probe_pass(f, true, 0, MIB, 8192, 1, 4096, &sec), SL_EINVAL);
	ck_assert_int_eq(sl_disk_probe_pass(f, true, 0, 1000, 4096, 1, 0, &sec), SL_EINVAL);
	sl_disk_probe_close(f);
	sl_disk_probe_close(NULL);
	d = opendir(dir);
	ck_assert(d);
	n = 0;
	for (struct dirent *de; (de = readdir(d));)
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	closedir(d);
	ck_assert_msg(n == 0, "the probe file is gone (%d entries left)", n);
}
END_TEST

/* ---- measurement (SLUICE_DISK_BENCH=DIR) ------------------------------------ */

START_TEST(test_bench)
{
	const char *dir = getenv("SLUICE_DISK_BENCH");
	const uint64_t total = 1024 * MIB;
	double g = 0;
	char mode[64];
	ck_assert_msg(sl_disk_probe_read(dir, total, &g, mode, sizeof mode) == 0, "%s", sl_errmsg());
	printf("probe: %s 1 GiB sequential O_DIRECT read: %.3f GB/s (%s, QD 32, 1 MiB)\n", dir, g, mode);

	sl_disk_params p = { .dir = dir, .file_name = "bench.sluice", .key = "bench", .data_bytes = total };
	sl_disk_store *s;
	bool fresh;
	ck_assert_msg(sl_disk_open(&p, &s, &fresh) == 0, "%s", sl_errmsg());
	const size_t req = 64 * MIB;
	const int nbuf = 4;
	char *buf = page_buf(req * nbuf);
	fill_random(buf, req * nbuf, 5);
	uint64_t tk[4] = { 0 };
	int nreq = (int)(total / req);
	for (int i = 0; i < nreq; i++) {
		if (tk[i % nbuf])
			ck_assert(sl_disk_wait(s, tk[i % nbuf]) == 0);
		ck_assert(sl_disk_write(s, (uint64_t)i * req, buf + (size_t)(i % nbuf) * req, req, &tk[i % nbuf]) == 0);
	}
	ck_assert_msg(sl_disk_mark_complete(s) == 0, "%s", sl_errmsg());
	sl_disk_close(s);
	ck_assert(sl_disk_open(&p, &s, &fresh) == 0 && !fresh);
	memset(tk, 0, sizeof tk);
	double t0 = sl_now();
	for (int i = 0; i < nreq; i++) {
		if (tk[i % nbuf])
			ck_assert(sl_disk_wait(s, tk[i % nbuf]) == 0);
		ck_assert(sl_disk_read(s, (uint64_t)i * req, buf + (size_t)(i % nbuf) * req, req, &tk[i % nbuf]) == 0);
	}
	ck_assert(sl_disk_wait_all(s) == 0);
	double dt = sl_now() - t0;
	sl_disk_stats st;
	sl_disk_get_stats(s, &st);
	printf("store: 1 GiB sequential read through sl_disk_read (64 MiB requests, 4 outstanding, 1 MiB chunks, "
	       "QD 32): %.3f GB/s (%s), busy %.3f s, %d chunks max in flight\n",
	       (double)total / dt / 1e9, sl_disk_mode(s), st.busy_s, st.max_in_flight);
	sl_disk_close(s);
	char path[600];
	join_path(path, sizeof path, dir, "bench.sluice");
	unlink(path);
	free(buf);
}
END_TEST

/* ---- main ---------------------------------------------------------------- */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void rm_tree(const char *root)
{
	if (root[0])
		nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* What a group of tests needs from the machine. */
enum need { NEED_URING = 1, NEED_SHM = 2, NEED_MOUNT = 4, NEED_NOBODY = 8, NEED_SECCOMP = 16,
	    NEED_ONE_NODE = 32 };

/* A child that tries what a need requires; exit 0 when it works. */
static int try_mount(void *vp)
{
	return private_mount((const char *)vp, "tmpfs", "size=1m") ? 0 : 1;
}

static int try_nobody(void *vp)
{
	(void)vp;
	return drop_root() ? 0 : 1;
}

static int try_seccomp(void *vp)
{
	(void)vp;
	struct sock_filter f[] = { BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
	struct sock_fprog prog = { .len = 1, .filter = f };
	return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0
		       ? 0 : 1;
}

/* A child's status without Check (main is not inside a test). */
static int child_status(int (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0)
		_exit(fn(arg));
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/* False, with the reason in why, when a need is missing here. */
static bool needs_met(int needs, char *why, size_t n)
{
	char d[512];
	if ((needs & NEED_URING) && !have_uring) {
		snprintf(why, n, "%s", uring_why);
		return false;
	}
	if ((needs & NEED_SHM) && !shm_root[0]) {
		snprintf(why, n, "no writable /dev/shm");
		return false;
	}
	if (needs & NEED_MOUNT) {
		snprintf(d, sizeof d, "%s/mount-probe", tmp_root);
		if (mkdir(d, 0755) != 0 || child_status(try_mount, d) != 0) {
			snprintf(why, n, "cannot mount a file system in a private mount namespace (unshare -m: needs "
				 "root or user namespaces)");
			return false;
		}
	}
	if ((needs & NEED_NOBODY) && child_status(try_nobody, NULL) != 0) {
		snprintf(why, n, "running as root and cannot become nobody (setresuid), so no folder is unwritable");
		return false;
	}
	if ((needs & NEED_SECCOMP) && child_status(try_seccomp, NULL) != 0) {
		snprintf(why, n, "cannot install a seccomp filter (prctl PR_SET_SECCOMP)");
		return false;
	}
	if ((needs & NEED_ONE_NODE) && sl_topo_io_node(NULL) < 0) {
		snprintf(why, n, "this process spans several NUMA nodes: no single node to bind to");
		return false;
	}
	return true;
}

/* Every engine test, for engines [lo, hi). */
static void add_engine_tests(Suite *su, int lo, int hi)
{
	TCase *tc = tcase_create("io");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_roundtrip, lo, hi);
	tcase_add_loop_test(tc, test_reopen, lo, hi);
	tcase_add_loop_test(tc, test_queue_exhaustion, lo, hi);
	tcase_add_loop_test(tc, test_window, lo, hi);
	tcase_add_loop_test(tc, test_bad_args, lo, hi);
	tcase_add_loop_test(tc, test_background_progress, lo, hi);
	tcase_add_loop_test(tc, test_threads, lo, hi);
	suite_add_tcase(su, tc);
	tc = tcase_create("faults");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_truncated, lo, hi);
	tcase_add_loop_test(tc, test_wait_after_reuse, lo, hi);
	tcase_add_loop_test(tc, test_header_sync_unlocked, lo, hi);
	tcase_add_loop_test(tc, test_efbig, lo, hi);
	suite_add_tcase(su, tc);
}

static const struct test_group {
	const char *name;
	int needs;
	const char *what;
} groups[] = {
	{ "core", 0, "the thread-pool engines (O_DIRECT and buffered), faults, folders, the probe" },
	{ "uring", NEED_URING, "the io_uring engine" },
	{ "shm", NEED_SHM, "a round trip in /dev/shm (tmpfs)" },
	{ "mounts", NEED_MOUNT, "a full tmpfs (ENOSPC) and ramfs (O_DIRECT refused), thread engines" },
	{ "mounts_uring", NEED_MOUNT | NEED_URING, "a full tmpfs (ENOSPC) on the io_uring engine" },
	{ "unwritable", NEED_NOBODY, "an offload folder the process cannot write to" },
	{ "no_uring", NEED_SECCOMP, "io_uring refused by a seccomp filter" },
	{ "io_node", NEED_ONE_NODE, "I/O threads bound to a NUMA node, thread engines" },
	{ "io_node_uring", NEED_ONE_NODE | NEED_URING, "I/O threads bound to a NUMA node, io_uring" },
	{ "bench", 0, "SLUICE_DISK_BENCH=DIR: a 1 GiB measurement in DIR" },
};

static Suite *group_suite(const char *g)
{
	Suite *su = suite_create("disk_store");
	TCase *tc = tcase_create(g);
	tcase_set_timeout(tc, 600);
	const int t0 = E_THREADS_DIRECT, t1 = E_COUNT; /* the thread engines */
	if (!strcmp(g, "core")) {
		add_engine_tests(su, t0, t1);
		tcase_add_test(tc, test_key_mismatch);
		tcase_add_test(tc, test_bad_params);
		tcase_add_test(tc, test_dirs);
		tcase_add_test(tc, test_both_fallbacks);
		tcase_add_test(tc, test_probe);
		tcase_add_test(tc, test_io_alloc);
	} else if (!strcmp(g, "uring")) {
		add_engine_tests(su, E_URING, E_URING + 1);
	} else if (!strcmp(g, "shm")) {
		tcase_add_test(tc, test_roundtrip_shm);
	} else if (!strcmp(g, "mounts")) {
		tcase_add_loop_test(tc, test_enospc, t0, t1);
		tcase_add_test(tc, test_ramfs_no_direct);
	} else if (!strcmp(g, "mounts_uring")) {
		tcase_add_loop_test(tc, test_enospc, E_URING, E_URING + 1);
	} else if (!strcmp(g, "unwritable")) {
		tcase_add_test(tc, test_unwritable);
	} else if (!strcmp(g, "no_uring")) {
		tcase_add_test(tc, test_no_uring);
	} else if (!strcmp(g, "io_node")) {
		tcase_add_loop_test(tc, test_io_node, t0, t1);
	} else if (!strcmp(g, "io_node_uring")) {
		tcase_add_loop_test(tc, test_io_node, E_URING, E_URING + 1);
	} else if (!strcmp(g, "bench")) {
		tcase_add_test(tc, test_bench);
	}
	suite_add_tcase(su, tc);
	return su;
}

int main(int argc, char **argv)
{
	const char *g = argc > 1 ? argv[1] : "core";
	const struct test_group *grp = NULL;
	for (size_t i = 0; i < SL_ARRAY_LEN(groups); i++)
		if (!strcmp(groups[i].name, g))
			grp = &groups[i];
	if (!grp) {
		fprintf(stderr, "usage: test_disk_store [GROUP]; groups:");
		for (size_t i = 0; i < SL_ARRAY_LEN(groups); i++)
			fprintf(stderr, " %s", groups[i].name);
		fprintf(stderr, "\n");
		return 2;
	}
	if (!strcmp(g, "bench") && !getenv("SLUICE_DISK_BENCH")) {
		fprintf(stderr, "test_disk_store: SKIP bench: SLUICE_DISK_BENCH=DIR is not set\n");
		return 77;
	}
	snprintf(tmp_root, sizeof tmp_root, "/tmp/sl-disk-XXXXXX");
	if (!mkdtemp(tmp_root)) {
		fprintf(stderr, "test_disk_store: cannot create a directory under /tmp: %s\n", strerror(errno));
		return 1;
	}
	chmod(tmp_root, 0755); /* the unwritable-dir case runs as nobody */
	struct stat st;
	if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(shm_root, sizeof shm_root, "/dev/shm/sl-disk-XXXXXX");
		if (!mkdtemp(shm_root))
			shm_root[0] = 0;
	}
	struct io_uring ring;
	int rc = io_uring_queue_init(4, &ring, 0);
	have_uring = rc == 0;
	if (have_uring)
		io_uring_queue_exit(&ring);
	else
		snprintf(uring_why, sizeof uring_why, "io_uring is unavailable here (io_uring_queue_init: %s)",
			 strerror(-rc));

	char why[300];
	int failed = 0;
	if (!needs_met(grp->needs, why, sizeof why)) {
		fprintf(stderr, "test_disk_store: SKIP %s (%s): %s\n", g, grp->what, why);
		failed = -1;
	} else {
		SRunner *sr = srunner_create(group_suite(g));
		srunner_run_all(sr, CK_NORMAL);
		failed = srunner_ntests_failed(sr);
		srunner_free(sr);
	}
	rm_tree(tmp_root);
	rm_tree(shm_root);
	return failed < 0 ? 77 : failed ? 1 : 0;
}
