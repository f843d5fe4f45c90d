/*
 * test_wstage.c - the weight staging engine (offload/wstage.c) on its own:
 * made-up layers whose units have a host part and a disk part of odd
 * sizes, streamed into the two slots in schedule order, by halves and
 * whole, with and without prefetch.
 *
 * Two layouts: units with both parts, and units on disk only.  Checked:
 * every byte of a unit arrives where the engine says (its host part at
 * the slot's start, its disk part at stage_disk), read by an op on the
 * compute queue issued after the acquire, as the model's compute reads
 * weights, the host not waiting for it before the next acquire; with
 * overlap, each acquire after the first finds its unit already loaded (one
 * load per acquire: a prefetch of any other unit costs a second load), and
 * the next unit's disk read is issued before the acquire returns; without
 * overlap, every acquire loads; units acquired out of schedule order still
 * arrive whole; and the refusals (a unit of the wrong kind, a release of a
 * unit not held, a layout the engine cannot stream).
 *
 * A store of zstd frames (zseg.h): layers of compressed and raw frames
 * streamed as above arrive whole (the decompression threads' work), and
 * a corrupt frame fails the acquire of its unit with the store, layer and
 * frame named, after which the engine still frees without hanging.
 *
 * argv[1]: the backend ("cpu" by default; the CUDA emulation's build runs
 * it with "cuda", where device memory is not host memory and the disk
 * parts go through the bounce buffers).  meson also runs it with the CPU
 * backend's copies started late (SLUICE_CPU_LATE_COPIES), where a slot
 * read before its load's event, or overwritten before the compute that
 * reads it is done, shows.
 */
#include "backend.h"
#include "disk_store.h"
#include "wstage.h"
#include "zseg.h"

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NL 3                /* layers: odd, so whole layers wrap onto the other slot */
#define HOST_BYTES 4096     /* a layer's host home */
#define SEG_BYTES 12288     /* a layer's disk segment */
#define Z_SEG 65536         /* a layer's disk segment in the zstd store */
#define Z_SPLIT 32768       /* its MLP half's start */
#define Z_WINDOW 16384      /* its frames' raw bytes: two per half */
#define SLOT_MAX (4096 + Z_SEG) /* the largest unit in a slot */
#define USES 16             /* read-backs in flight at once */

static const char *backend_name = "cpu";
static char dir[64];

/* The byte at offset off of layer l's host home (tier 0) or disk segment
 * (tier 1): different in every layer, tier and place.  Read as fp16 (the
 * odd byte the high one) every value is finite: bit 6 of a high byte, an
 * exponent bit, is clear. */
static unsigned char pattern(int tier, int l, size_t off)
{
	uint32_t x = (uint32_t)off * 2654435761u ^ (uint32_t)(l + 1) * 40503u ^ (uint32_t)tier * 977u;
	x ^= x >> 15;
	x *= 0x2c1b3c6du;
	x ^= x >> 12;
	/* on disk the high bytes are two values, so that a zstd frame of
	 * them compresses, except in one window of each layer's (its
	 * frame stays raw) */
	if (tier == 1 && off % 2 && (off / Z_WINDOW) % 4 != (size_t)l % 4)
		return (unsigned char)(0x38 | (x & 1));
	return (unsigned char)(off % 2 ? x & 0xbf : x);
}

/* The fp16 value at (even) offset off, as a float. */
static float pattern_half(int tier, int l, size_t off)
{
	return sl_half_to_float((sl_half)(pattern(tier, l, off) | pattern(tier, l, off + 1) << 8));
}

/* The units: host parts of sizes that are not pages, the MLP half's disk
 * part starting on a page. */
static const sl_wstage_unit units[3] = {
	[SL_UNIT_ATTN] = { .host_off = 0, .host_len = 1000, .disk_off = 0, .disk_len = 8192,
			   .stage_disk = 4096 },
	[SL_UNIT_MLP] = { .host_off = 1024, .host_len = 3000, .disk_off = 8192, .disk_len = 4096,
			  .stage_disk = 4096 },
	[SL_UNIT_LAYER] = { .host_off = 0, .host_len = 4024, .disk_off = 0, .disk_len = 12288,
			    .stage_disk = 4096 },
};

/* The same on disk only: a unit's disk part is its only part, so nothing
 * but the disk path orders its copy after the compute reading the slot. */
static const sl_wstage_unit disk_units[3] = {
	[SL_UNIT_ATTN] = { .disk_off = 0, .disk_len = 8192 },
	[SL_UNIT_MLP] = { .disk_off = 8192, .disk_len = 4096 },
	[SL_UNIT_LAYER] = { .disk_off = 0, .disk_len = 12288 },
};

typedef struct fixture {
	size_t seg_bytes;    /* a layer's disk segment */
	sl_zseg_table *zt;   /* the store's zstd frames, or NULL */
	sl_backend *be;
	sl_queue *q;  /* compute */
	sl_disk_store *disk;
	void *host[NL];
	sl_wstage_home home[NL];
	float *read;         /* device: USES slots read by compute, SLOT_MAX / 2 values each */
	float *seen;         /* the same on the host */
	int used[USES][2];   /* the layer and unit of each */
	int nused;
	sl_weight_stats stats;
	const sl_wstage_unit *units; /* the layout streamed */
	sl_wstage *s;
} fixture;

/* Write layer l's disk segment at its place: its plain bytes, or with a
 * table, each window as the zstd frame a convert --zstd writes (its
 * length recorded in the table; corrupt: one byte of frame 1 flipped). */
static void write_segment(fixture *f, int l, sl_zseg_table *zt, bool corrupt)
{
	const size_t n = f->seg_bytes;
	unsigned char *seg, *img;
	ck_assert_int_eq(posix_memalign((void **)&seg, SL_DISK_ALIGN, n), 0);
	ck_assert_int_eq(posix_memalign((void **)&img, SL_DISK_ALIGN, n), 0);
	for (size_t i = 0; i < n; i++)
		seg[i] = pattern(1, l, i);
	memcpy(img, seg, n);
	for (int fr = 0; zt && fr < zt->nframes; fr++) {
		uint64_t off;
		size_t len, clen;
		sl_zseg_frame(zt->seg, zt->split, zt->window, fr, &off, &len);
		const size_t cap = sl_zseg_bound(len);
		unsigned char *scratch = malloc(len), *z = malloc(cap);
		ck_assert_int_eq(sl_zseg_compress(NULL, 1, seg + off, len, scratch, z, cap, &clen), 0);
		zt->clen[(size_t)l * (size_t)zt->nframes + (size_t)fr] = (uint32_t)clen;
		if (clen) {
			memset(img + off, 0, len);
			memcpy(img + off, z, clen);
			if (corrupt && fr == 0)
				img[off + clen / 2] ^= 0x5a;
		}
		free(scratch);
		free(z);
	}
	uint64_t t;
	ck_assert_int_eq(sl_disk_write(f->disk, (uint64_t)l * n, img, n, &t), 0);
	ck_assert_msg(sl_disk_wait(f->disk, t) == 0, "%s", sl_errmsg());
	free(seg);
	free(img);
}

static void setup_seg(fixture *f, size_t seg_bytes, sl_zseg_table *zt)
{
	memset(f, 0, sizeof *f);
	f->seg_bytes = seg_bytes;
	ck_assert_msg(sl_backend_create(backend_name, 1, &f->be) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sl_queue_create(f->be, &f->q), 0);
	char name[64];
	snprintf(name, sizeof name, "wstage-%zu.sluice", seg_bytes);
	sl_disk_params dp = { .dir = dir, .file_name = name, .key = "test_wstage",
			      .data_bytes = (uint64_t)NL * seg_bytes };
	bool fresh;
	ck_assert_msg(sl_disk_open(&dp, &f->disk, &fresh) == 0, "%s", sl_errmsg());
	for (int l = 0; l < NL; l++) {
		ck_assert_int_eq(sl_host_alloc(f->be, HOST_BYTES, "host home", &f->host[l]), 0);
		for (size_t i = 0; i < HOST_BYTES; i++)
			((unsigned char *)f->host[l])[i] = pattern(0, l, i);
		write_segment(f, l, zt, false);
		f->home[l] = (sl_wstage_home){ .host = f->host[l], .disk_off = (uint64_t)l * seg_bytes };
	}
	f->zt = zt;
	ck_assert_int_eq(sl_dev_alloc(f->be, USES * SLOT_MAX * 2, "read", (void **)&f->read), 0);
	ck_assert_int_eq(sl_host_alloc(f->be, USES * SLOT_MAX * 2, "read back", (void **)&f->seen), 0);
}

static void create_units(fixture *f, const sl_wstage_unit *un, bool halves, bool overlap)
{
	f->units = un;
	sl_wstage_params p = { .n_layer = NL, .halves = halves, .overlap = overlap, .home = f->home,
			       .disk = f->disk, .zt = f->zt, .stats = &f->stats };
	memcpy(p.unit, un, sizeof p.unit);
	ck_assert_msg(sl_wstage_create(f->be, &p, &f->s) == 0, "%s", sl_errmsg());
}

static void setup(fixture *f)
{
	setup_seg(f, SEG_BYTES, NULL);
}

static void create(fixture *f, bool halves, bool overlap)
{
	create_units(f, units, halves, overlap);
}

static void teardown(fixture *f)
{
	sl_wstage_free(f->s);
	sl_host_free(f->be, f->seen, USES * SLOT_MAX * 2);
	sl_dev_free(f->be, f->read, USES * SLOT_MAX * 2);
	for (int l = 0; l < NL; l++)
		sl_host_free(f->be, f->host[l], HOST_BYTES);
	sl_disk_close(f->disk);
	sl_queue_free(f->be, f->q);
	sl_backend_free(f->be);
}

/* Check every value of the units read so far (after the compute queue is
 * done) and forget them. */
static void check_used(fixture *f)
{
	ck_assert_int_eq(sl_queue_sync(f->be, f->q), 0);
	for (int j = 0; j < f->nused; j++) {
		const int l = f->used[j][0], u = f->used[j][1];
		const sl_wstage_unit *x = &f->units[u];
		const float *seen = f->seen + (size_t)j * SLOT_MAX / 2;
		for (size_t i = 0; i < x->host_len / 2; i++)
			ck_assert_msg(seen[i] == pattern_half(0, l, x->host_off + 2 * i),
				      "use %d, layer %d unit %d: host value %zu is %g, want %g", j, l, u, i,
				      seen[i], pattern_half(0, l, x->host_off + 2 * i));
		for (size_t i = 0; i < x->disk_len / 2; i++)
			ck_assert_msg(seen[x->stage_disk / 2 + i] == pattern_half(1, l, x->disk_off + 2 * i),
				      "use %d, layer %d unit %d: disk value %zu is %g, want %g", j, l, u, i,
				      seen[x->stage_disk / 2 + i], pattern_half(1, l, x->disk_off + 2 * i));
	}
	f->nused = 0;
}

/* Acquire unit u of layer l, have the compute queue read the slot (an op,
 * as the model's compute reads weights: the host does not wait for it) and
 * copy what it read back, release.  The next loads into that slot must wait
 * for the read. */
static void use_unit(fixture *f, int l, int u)
{
	sl_backend *b = f->be;
	const sl_wstage_unit *x = &f->units[u];
	if (f->nused == USES)
		check_used(f);
	const size_t at = (size_t)f->nused * SLOT_MAX / 2;
	const int n = (int)(x->stage_disk + x->disk_len) / 2;
	f->used[f->nused][0] = l;
	f->used[f->nused][1] = u;
	f->nused++;
	void *slot;
	ck_assert_msg(sl_wstage_acquire(f->s, f->q, l, u, &slot) == 0, "%s", sl_errmsg());
	const int32_t row0 = 0;
	ck_assert_int_eq(sl_embed(b, f->q, 1, n, slot, &row0, f->read + at, false), 0);
	ck_assert_msg(sl_wstage_release(f->s, f->q, l, u) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(sl_copy_d2h(b, f->q, f->seen + at, f->read + at, (size_t)n * 4), 0);
}

/* The bytes unit u of layer l reads from disk: its disk part, or from a
 * zstd store its frames' (a compressed one's pages). */
static uint64_t unit_disk_bytes(const fixture *f, int l, int u)
{
	const sl_wstage_unit *x = &f->units[u];
	if (!f->zt)
		return x->disk_len;
	int f0, f1;
	uint64_t n = 0;
	sl_zseg_frames_in(f->zt, x->disk_off, x->disk_len, &f0, &f1);
	for (int fr = f0; fr < f1; fr++) {
		uint64_t off;
		size_t len;
		sl_zseg_frame(f->zt->seg, f->zt->split, f->zt->window, fr, &off, &len);
		const uint32_t c = f->zt->clen[(size_t)l * (size_t)f->zt->nframes + (size_t)fr];
		n += c ? (c + SL_DISK_ALIGN - 1) / SL_DISK_ALIGN * SL_DISK_ALIGN : len;
	}
	return n;
}

/* Two passes over the units of a layout in schedule order (from a store
 * of zstd frames where zt is given: its lengths are filled in). */
static void stream_store(const sl_wstage_unit *un, bool halves, bool overlap, sl_zseg_table *zt)
{
	fixture f;
	setup_seg(&f, zt ? Z_SEG : SEG_BYTES, zt);
	create_units(&f, un, halves, overlap);
	const int per = halves ? 2 : 1, units_n = NL * per;
	uint64_t disk = 0, h2d = 0;
	for (int i = 0; i < 2 * units_n; i++) {
		const int idx = i % units_n, l = idx / per, u = halves ? idx % 2 : SL_UNIT_LAYER;
		use_unit(&f, l, u);
		/* what was loaded so far: with overlap every unit up to the
		 * next one (prefetched), else every unit up to this one; where
		 * the device is not host memory, a unit's disk part crosses to
		 * the device (h2d) when the unit is acquired */
		const int next = (idx + 1) % units_n, nu = halves ? next % 2 : SL_UNIT_LAYER;
		if (!f.be->ops->dev_is_host)
			h2d += un[u].disk_len;
		if (i == 0 || !overlap) {
			disk += unit_disk_bytes(&f, l, u);
			h2d += un[u].host_len;
		}
		if (overlap) {
			disk += unit_disk_bytes(&f, halves ? next / 2 : next, nu);
			h2d += un[nu].host_len;
		}
		ck_assert_msg(f.stats.loads == (overlap ? i + 2 : i + 1),
			      "after acquire %d (layer %d unit %d): %d loads, want %d", i, l, u,
			      f.stats.loads, overlap ? i + 2 : i + 1);
		ck_assert_uint_eq(f.stats.disk_read_bytes, disk);
		ck_assert_uint_eq(f.stats.h2d_bytes, h2d);
	}
	check_used(&f);
	ck_assert_uint_eq(f.stats.disk_write_bytes, 0);
	teardown(&f);
}

static void stream(const sl_wstage_unit *un, bool halves, bool overlap)
{
	stream_store(un, halves, overlap, NULL);
}

START_TEST(halves_prefetch)
{
	stream(units, true, true);
	stream(disk_units, true, true);
}
END_TEST

START_TEST(whole_prefetch)
{
	stream(units, false, true);
	stream(disk_units, false, true);
}
END_TEST

START_TEST(halves_no_prefetch)
{
	stream(units, true, false);
	stream(disk_units, true, false);
}
END_TEST

START_TEST(whole_no_prefetch)
{
	stream(units, false, false);
	stream(disk_units, false, false);
}
END_TEST

/* Units acquired out of schedule order (each acquire may then prefetch into
 * a slot whose own prefetch has not been acquired) still arrive whole. */
START_TEST(out_of_order)
{
	static const int order[] = { 0, 2, 1, 1, 0, 0, 2, 2, 1, 0, 2, 1 };
	for (int overlap = 0; overlap < 2; overlap++) {
		fixture f;
		setup(&f);
		create(&f, false, overlap);
		for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
			use_unit(&f, order[i], SL_UNIT_LAYER);
		check_used(&f);
		teardown(&f);
	}
}
END_TEST

START_TEST(refusals)
{
	fixture f;
	setup(&f);
	create(&f, true, true);
	void *slot;
	ck_assert_int_eq(sl_wstage_acquire(f.s, f.q, 0, SL_UNIT_LAYER, &slot), SL_EINVAL);
	ck_assert_str_eq(sl_errmsg(), "weights streamed by halves cannot be acquired whole");
	ck_assert_int_eq(sl_wstage_acquire(f.s, f.q, NL, SL_UNIT_ATTN, &slot), SL_EINVAL);
	ck_assert_int_eq(sl_wstage_release(f.s, f.q, 1, SL_UNIT_MLP), SL_EINVAL);
	ck_assert_str_eq(sl_errmsg(), "weights of layer 1 released but not acquired");
	use_unit(&f, 0, SL_UNIT_ATTN); /* still usable */
	check_used(&f);
	sl_wstage_free(f.s);
	f.s = NULL;
	const size_t dev_used = f.be->dev_used;

	sl_wstage *s = NULL;
	sl_wstage_params p = { .n_layer = NL, .home = f.home, .disk = NULL };
	memcpy(p.unit, units, sizeof units);
	ck_assert_int_eq(sl_wstage_create(f.be, &p, &s), SL_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert_msg(strstr(sl_errmsg(), "on disk but no store"), "%s", sl_errmsg());
	p.disk = f.disk;
	p.unit[SL_UNIT_MLP].stage_disk = 2048;
	ck_assert_int_eq(sl_wstage_create(f.be, &p, &s), SL_EINVAL);
	ck_assert_msg(strstr(sl_errmsg(), "not page aligned"), "%s", sl_errmsg());
	ck_assert_uint_eq(f.be->dev_used, dev_used); /* nothing left allocated */
	teardown(&f);
}
END_TEST

/* The slot sizes the byte arithmetic (the run plan) counts: by halves each
 * slot its half's, else both the whole layer's. */
/* The zstd store's units: both parts, and disk only. */
static const sl_wstage_unit z_units[3] = {
	[SL_UNIT_ATTN] = { .host_off = 0, .host_len = 1000, .disk_off = 0, .disk_len = Z_SPLIT,
			   .stage_disk = 4096 },
	[SL_UNIT_MLP] = { .host_off = 1024, .host_len = 3000, .disk_off = Z_SPLIT,
			  .disk_len = Z_SEG - Z_SPLIT, .stage_disk = 4096 },
	[SL_UNIT_LAYER] = { .host_off = 0, .host_len = 4024, .disk_off = 0, .disk_len = Z_SEG,
			    .stage_disk = 4096 },
};
static const sl_wstage_unit z_disk_units[3] = {
	[SL_UNIT_ATTN] = { .disk_off = 0, .disk_len = Z_SPLIT },
	[SL_UNIT_MLP] = { .disk_off = Z_SPLIT, .disk_len = Z_SEG - Z_SPLIT },
	[SL_UNIT_LAYER] = { .disk_off = 0, .disk_len = Z_SEG },
};

/* Stream a zstd store's units; every layer holds compressed frames and
 * one raw frame. */
static void stream_zstd(const sl_wstage_unit *un, bool halves, bool overlap)
{
	sl_zseg_table t;
	ck_assert_int_eq(sl_zseg_table_init(&t, Z_SEG, Z_SPLIT, Z_WINDOW, NL, 1), 0);
	ck_assert_int_eq(t.nframes, 4);
	stream_store(un, halves, overlap, &t);
	for (int l = 0; l < NL; l++)
		for (int fr = 0; fr < t.nframes; fr++)
			ck_assert_msg((t.clen[l * t.nframes + fr] == 0) == (fr == l % 4),
				      "layer %d frame %d: compressed to %u bytes", l, fr,
				      t.clen[l * t.nframes + fr]);
	sl_zseg_table_free(&t);
}

START_TEST(zstd_halves_prefetch)
{
	stream_zstd(z_units, true, true);
}
END_TEST

START_TEST(zstd_whole_no_prefetch)
{
	stream_zstd(z_disk_units, false, false);
}
END_TEST

START_TEST(zstd_disk_halves_prefetch)
{
	stream_zstd(z_disk_units, true, true);
}
END_TEST

/* A corrupt frame in layer 1's attention half: the units before it
 * arrive, its acquire fails naming the store, the layer and the frame
 * (its prefetch, issued by the acquire before, did not), and the engine
 * frees with nothing left hanging. */
START_TEST(zstd_corrupt_frame)
{
	sl_zseg_table t;
	ck_assert_int_eq(sl_zseg_table_init(&t, Z_SEG, Z_SPLIT, Z_WINDOW, NL, 1), 0);
	fixture f;
	setup_seg(&f, Z_SEG, &t);
	write_segment(&f, 1, &t, true);
	ck_assert_uint_ne(t.clen[1 * t.nframes + 0], 0);
	create_units(&f, z_disk_units, true, true);
	use_unit(&f, 0, SL_UNIT_ATTN);
	use_unit(&f, 0, SL_UNIT_MLP);
	check_used(&f);
	void *slot;
	ck_assert_int_eq(sl_wstage_acquire(f.s, f.q, 1, SL_UNIT_ATTN, &slot), SL_EFORMAT);
	char want[128];
	snprintf(want, sizeof want, "wstage-%d.sluice: layer 1, zstd frame 0 is corrupt", Z_SEG);
	ck_assert_msg(strstr(sl_errmsg(), want), "message: %s", sl_errmsg());
	teardown(&f);
	sl_zseg_table_free(&t);
}
END_TEST

START_TEST(slot_bytes)
{
	size_t dev, bounce;
	sl_wstage_slot_bytes(units, true, 0, &dev, &bounce);
	ck_assert_uint_eq(dev, 4096 + 8192);
	ck_assert_uint_eq(bounce, 8192);
	sl_wstage_slot_bytes(units, true, 1, &dev, &bounce);
	ck_assert_uint_eq(dev, 4096 + 4096);
	ck_assert_uint_eq(bounce, 4096);
	for (int k = 0; k < 2; k++) {
		sl_wstage_slot_bytes(units, false, k, &dev, &bounce);
		ck_assert_uint_eq(dev, 4096 + 12288);
		ck_assert_uint_eq(bounce, 12288);
	}
	fixture f;
	setup(&f);
	const size_t before = f.be->dev_used;
	create(&f, true, true);
	ck_assert_uint_eq(f.be->dev_used - before, 4096 + 8192 + 4096 + 4096);
	teardown(&f);
}
END_TEST

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		backend_name = argv[1];
	snprintf(dir, sizeof dir, "/tmp/sl_wstage_XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	Suite *s = suite_create("wstage");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, halves_prefetch);
	tcase_add_test(tc, whole_prefetch);
	tcase_add_test(tc, halves_no_prefetch);
	tcase_add_test(tc, whole_no_prefetch);
	tcase_add_test(tc, out_of_order);
	tcase_add_test(tc, refusals);
	tcase_add_test(tc, slot_bytes);
	tcase_add_test(tc, zstd_halves_prefetch);
	tcase_add_test(tc, zstd_whole_no_prefetch);
	tcase_add_test(tc, zstd_disk_halves_prefetch);
	tcase_add_test(tc, zstd_corrupt_frame);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	const int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	return failed ? 1 : 0;
}
