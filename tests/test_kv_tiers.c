/*
 * test_kv_tiers.c - the KV cache's tiers (offload/kv_tiers.h) alone, on
 * plain byte blocks, with no model: the split of a micro-batch against a
 * counting reference, the bytes the placement arithmetic states against
 * what the tiers allocate (device, pinned host, the disk scratch store),
 * and the disk tier's page write-back read back byte for byte, with the
 * pages it writes counted against the set of pages the ranges touch.
 */
#include "backend.h"
#include "kv_tiers.h"

#include "testutil.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char offdir[256];

static void make_offdir(void)
{
	snprintf(offdir, sizeof offdir, "/tmp/sluice-kvtiers-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(offdir));
}

static void rm_offdir(void)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", offdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* round(x) for x >= 0, half up, by counting: the integers i >= 0 with
 * i + 1/2 <= x. */
static int round_count(double x)
{
	int n = 0;
	while (n + 0.5 <= x)
		n++;
	return n;
}

static const double percents[] = { 0, 10, 12.5, 25, 30, 33.3, 50, 66.7, 70, 75, 90, 100 };

START_TEST(test_split)
{
	for (int g = 1; g <= 20; g++)
		for (size_t i = 0; i < SL_ARRAY_LEN(percents); i++)
			for (size_t j = 0; j < SL_ARRAY_LEN(percents); j++) {
				const double gpu = percents[i], cpu = percents[j];
				const sl_kvt_split s = sl_kvt_split_of(g, gpu, cpu);
				int dev = SL_MIN(round_count(g * gpu / 100.0), g);
				int dh = SL_MIN(round_count(g * (gpu + cpu) / 100.0), g);
				ck_assert_msg(s.dev == dev && s.host == dh - dev && s.disk == g - dh,
					      "g %d, %g%% / %g%%: %d %d %d, expected %d %d %d", g, gpu,
					      cpu, s.dev, s.host, s.disk, dev, dh - dev, g - dh);
			}
	/* a block of micro-batches: the sums and the largest parts */
	for (int nseq = 1; nseq <= 13; nseq++)
		for (int gs = 1; gs <= nseq; gs++) {
			const sl_kvt_counts c = sl_kvt_counts_of(nseq, gs, 30, 40);
			int dev = 0, host = 0, disk = 0, mh = 0, md = 0, nmb = 0;
			for (int s0 = 0; s0 < nseq; s0 += gs, nmb++) {
				const int g = SL_MIN(gs, nseq - s0);
				const int d = round_count(g * 0.3), dh = round_count(g * 0.7);
				dev += d;
				host += dh - d;
				disk += g - dh;
				mh = SL_MAX(mh, dh - d);
				md = SL_MAX(md, g - dh);
			}
			ck_assert_int_eq(c.dev, dev);
			ck_assert_int_eq(c.host, host);
			ck_assert_int_eq(c.disk, disk);
			ck_assert_int_eq(c.maxhost, mh);
			ck_assert_int_eq(c.maxdisk, md);
			ck_assert_int_eq(c.nmb, nmb);
		}
}
END_TEST

static sl_kvt_params params(sl_backend *be, sl_kv_stats *st, int nseq, int gs, double gpu,
			    double cpu, size_t sb, size_t ss)
{
	return (sl_kvt_params){ .be = be, .n_layer = 3, .nseq = nseq, .gs = gs,
				.gpu_percent = gpu, .cpu_percent = cpu, .seq_bytes = sb,
				.state_bytes = ss, .max_ranges = 4, .offload_dir = offdir,
				.store_name = "test", .stats = st };
}

/* The tiers allocate what sl_kvt_sizes states for the off-device part
 * (the device homes are the logical cache's, so the device figure less
 * them), and the scratch store holds its disk figure. */
START_TEST(test_sizes_are_allocated)
{
	static const struct {
		double gpu, cpu;
	} place[] = { { 0, 100 }, { 0, 0 }, { 30, 30 }, { 50, 0 }, { 20, 70 }, { 0, 50 } };
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	for (size_t i = 0; i < SL_ARRAY_LEN(place); i++)
		for (int gs = 1; gs <= 5; gs += 2)
			for (int h2o = 0; h2o <= 1; h2o++) {
				const size_t sb = 3000, ss = h2o ? 200 : 0;
				sl_kv_stats st = { 0 };
				sl_kvt_params p = params(be, &st, 5, gs, place[i].gpu, place[i].cpu, sb, ss);
				sl_kv_sizes z;
				sl_kvt_sizes(p.n_layer, p.nseq, gs, sb, ss, p.gpu_percent, p.cpu_percent,
					     be->ops->dev_is_host, &z);
				if (z.dev_seqs == p.nseq) /* no tiers: the cache makes none */
					continue;
				const size_t dev0 = be->data_used, host0 = be->host_used;
				sl_kv_tiers *T = NULL;
				ck_assert_int_eq(sl_kvt_create(&p, &T), 0);
				const size_t homes = (size_t)p.n_layer * z.dev_seqs * 2 * (sb + ss);
				ck_assert_msg(be->data_used - dev0 == z.device - homes,
					      "%g/%g gs %d: device %zu, stated %zu", place[i].gpu,
					      place[i].cpu, gs, be->data_used - dev0, z.device - homes);
				ck_assert_int_eq(be->host_used - host0, z.host);
				ck_assert_int_eq(st.disk_bytes, z.disk);
				ck_assert_int_eq(T->nhost, z.host_seqs);
				sl_kvt_free(T);
				ck_assert_int_eq(be->data_used, dev0);
				ck_assert_int_eq(be->host_used, host0);
			}
	sl_backend_free(be);
}
END_TEST

/* Write ranges of a stage's disk part as pages, read the segment back
 * into another stage, compare. */
static void write_pages(sl_kv_tiers *T, sl_kvt_stage *st, const size_t *off, const size_t *len,
			int n)
{
	for (int i = 0; i < n; i++) {
		st->offs[i] = off[i];
		st->lens[i] = len[i];
	}
	ck_assert_int_eq(sl_kvt_disk_pages(T, st, n), 0);
	ck_assert_int_eq(st->pend, SL_KVT_PEND_DISK);
	ck_assert_int_eq(sl_kvt_flush_disk(T, st), 0);
	ck_assert_int_eq(sl_kvt_wait_writes(T, st), 0);
}

/* Stage a's disk part of layer l (ndisk units, part bytes) filled with a
 * pattern (byte i: i * mul + add) and written whole, as a prefill writes
 * it; the part. */
static char *write_whole(sl_kv_tiers *T, sl_kvt_stage *a, int l, int ndisk, size_t part, int mul, int add)
{
	char *da = sl_kvt_stage_disk(T, a, ndisk, SL_KVT_K, 0);
	for (size_t i = 0; i < part; i++)
		da[i] = (char)(i * mul + add);
	a->l = l;
	a->pmb = 0;
	const size_t whole_off = 0;
	write_pages(T, a, &whole_off, &part, 1);
	return da;
}

/* A one-thread CPU backend and a queue on it. */
static sl_backend *cpu_with_queue(sl_queue **q)
{
	sl_backend *be = NULL;
	ck_assert_int_eq(sl_backend_create("cpu", 1, &be), 0);
	ck_assert_int_eq(be->ops->queue_create(be, q), 0);
	return be;
}

static void read_back(sl_kv_tiers *T, sl_kvt_stage *st, sl_queue *q, int l, int ndisk, const size_t *fill)
{
	sl_backend *be = T->p.be;
	ck_assert_int_eq(sl_kvt_load_disk(T, st, l, 0, ndisk, fill), 0);
	ck_assert_int_eq(sl_kvt_ready(T, st, q), 0);
	ck_assert_int_eq(be->ops->queue_sync(be, q), 0);
}

START_TEST(test_disk_pages_round_trip)
{
	sl_queue *q = NULL;
	sl_backend *be = cpu_with_queue(&q);
	sl_kv_stats stats = { 0 };
	/* three sequences, all on disk; units of 2 x (3000 + 200) bytes */
	sl_kvt_params p = params(be, &stats, 3, 3, 0, 0, 3000, 200);
	sl_kv_tiers *T = NULL;
	ck_assert_int_eq(sl_kvt_create(&p, &T), 0);
	ck_assert_ptr_nonnull(T->disk);
	const int l = 1, ndisk = 3;
	const size_t part = (size_t)ndisk * 2 * (3000 + 200);
	sl_kvt_stage *a = &T->st[0], *b = &T->st[1];
	char *da = write_whole(T, a, l, ndisk, part, 7, 3);
	char *db = sl_kvt_stage_disk(T, b, ndisk, SL_KVT_K, 0);
	memset(db, 0, part);
	read_back(T, b, q, l, ndisk, NULL);
	ck_assert_int_eq(memcmp(da, db, part), 0);
	/* a few rows changed, as a decode step writes them: only their pages */
	const size_t off[] = { 6000 + 10, 10, 2 * 3000 + 4090, 4 * 3000 + 3 * 200 + 7, 100 };
	const size_t len[] = { 7, 20, 12, 200, 4000 };
	const int n = (int)SL_ARRAY_LEN(off);
	bool page[64] = { false };
	for (int i = 0; i < n; i++) {
		for (size_t x = off[i]; x < off[i] + len[i]; x++) {
			da[x] = (char)~da[x];
			page[x / SL_DISK_ALIGN] = true;
		}
	}
	size_t pages = 0;
	for (size_t i = 0; i < SL_ARRAY_LEN(page); i++)
		pages += page[i];
	const uint64_t w0 = stats.disk_write_bytes;
	write_pages(T, a, off, len, n);
	ck_assert_int_eq(stats.disk_write_bytes - w0, pages * SL_DISK_ALIGN);
	memset(db, 0, part);
	read_back(T, b, q, l, ndisk, NULL);
	ck_assert_int_eq(memcmp(da, db, part), 0);
	/* another layer's segment is untouched */
	memset(db, 0x5a, part);
	read_back(T, b, q, 0, ndisk, NULL);
	for (size_t i = 0; i < part; i++)
		ck_assert_int_eq(db[i], 0);
	ck_assert_int_eq(sl_kvt_pass_end(T), 0);
	sl_kvt_free(T);
	be->ops->queue_free(be, q);
	ck_assert_int_eq(be->data_used, 0);
	ck_assert_int_eq(be->host_used, 0);
	sl_backend_free(be);
}
END_TEST

/* A decode step's load reads each block only up to its rows in use (as
 * FlexGen reads its cache only up to the tokens so far): the bytes in use
 * arrive, the pages holding none are neither read nor counted. */
START_TEST(test_disk_load_reads_rows_in_use)
{
	sl_queue *q = NULL;
	sl_backend *be = cpu_with_queue(&q);
	sl_kv_stats stats = { 0 };
	/* three sequences on disk; blocks of 10000 bytes, state blocks of 200 */
	const size_t sb = 10000, ss = 200;
	sl_kvt_params p = params(be, &stats, 3, 3, 0, 0, sb, ss);
	sl_kv_tiers *T = NULL;
	ck_assert_int_eq(sl_kvt_create(&p, &T), 0);
	const int l = 0, ndisk = 3;
	const size_t part = (size_t)ndisk * 2 * (sb + ss);
	sl_kvt_stage *a = &T->st[0], *b = &T->st[1];
	const char *da = write_whole(T, a, l, ndisk, part, 13, 1);
	char *db = sl_kvt_stage_disk(T, b, ndisk, SL_KVT_K, 0);
	/* sequence 0 holds 100 bytes, 1 is full, 2 is empty */
	const size_t fill[] = { 100, sb, 0 };
	bool in_use[16 * 4096] = { false }, page[16] = { false };
	ck_assert_uint_le(part, sizeof in_use);
	for (int v = SL_KVT_K; v <= SL_KVT_V; v++)
		for (int j = 0; j < ndisk; j++) {
			const size_t o = sl_kvt_grp_off((size_t)ndisk, sb, ss, v, (size_t)j);
			for (size_t x = o; x < o + fill[j]; x++)
				in_use[x] = true;
		}
	for (size_t x = sl_kvt_grp_off((size_t)ndisk, sb, ss, SL_KVT_S, 0); x < part; x++)
		in_use[x] = true;
	size_t pages = 0;
	for (size_t x = 0; x < part; x++)
		if (in_use[x] && !page[x / SL_DISK_ALIGN]) {
			page[x / SL_DISK_ALIGN] = true;
			pages++;
		}
	ck_assert_uint_lt(pages, (part + SL_DISK_ALIGN - 1) / SL_DISK_ALIGN); /* some are skipped */
	memset(db, 0x5a, part);
	const uint64_t r0 = stats.disk_read_bytes;
	read_back(T, b, q, l, ndisk, fill);
	ck_assert_uint_eq(stats.disk_read_bytes - r0, pages * SL_DISK_ALIGN);
	for (size_t x = 0; x < part; x++) {
		if (in_use[x] || page[x / SL_DISK_ALIGN])
			ck_assert_int_eq(db[x], da[x]);
		else
			ck_assert_int_eq(db[x], 0x5a);
	}
	ck_assert_int_eq(sl_kvt_pass_end(T), 0);
	sl_kvt_free(T);
	be->ops->queue_free(be, q);
	sl_backend_free(be);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_tiers");
	TCase *tc = tcase_create("tiers");
	tcase_add_checked_fixture(tc, make_offdir, rm_offdir);
	tcase_add_test(tc, test_split);
	tcase_add_test(tc, test_sizes_are_allocated);
	tcase_add_test(tc, test_disk_pages_round_trip);
	tcase_add_test(tc, test_disk_load_reads_rows_in_use);
	suite_add_tcase(s, tc);
	return sl_test_run(s);
}
