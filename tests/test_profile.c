/*
 * test_profile.c - the hardware profile's file (policy/profile.h), as the
 * cost model will read it: linked with the policy library and common/
 * only, no runtime, backend or disk store.
 *
 * What a user of the file relies on:
 *  - a profile written by sl_profile_save_json reads back equal, field by
 *    field, doubles to the bit: a full one (two NUMA nodes, a GPU, every
 *    rate, format 2's GEMM curve, latencies and attention rates), one with
 *    nothing optional (no GPU, no disk, nodes unknown, no curve), and one
 *    of a machine with more nodes than a profile lists;
 *  - a format 1 file (before the cost model's rates) still reads, its
 *    format 2 fields 0 and its curve empty;
 *  - a malformed profile is refused with a one-line message that names the
 *    file and the field ("topology.numa_nodes[1].cores"), the right code,
 *    and the destination left as it was;
 *  - a missing file, a directory and text that is not JSON are refused
 *    naming the file; fields a later sluice may add are ignored;
 *  - the median every measured rate and the fit are taken with
 *    (sl_median): the middle of an odd count, the mean of the middle two of
 *    an even one, whatever the order.
 */
#include "profile.h"
#include "sl_common.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void make_tmpdir(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/sl_profile_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* A profile with every field set, none of them a round number. */
static void full_profile(sl_profile *p)
{
	memset(p, 0, sizeof *p);
	p->quick = true;
	sl_profile_topo *t = &p->topo;
	t->loaded = true;
	t->packages = 2;
	t->cores = 96;
	t->pus = 192;
	t->nnodes = 2;
	for (int i = 0; i < 2; i++) {
		t->node[i].os_index = 1 - i; /* listed in any order */
		t->node[i].memory_bytes = ((uint64_t)1 << 40) + 12345 * (uint64_t)(i + 1);
		t->node[i].cores = 48;
		t->node[i].pus = 96;
		snprintf(t->node[i].cpus, sizeof t->node[i].cpus, "%d-%d,%d-%d", 48 * i, 48 * i + 47, 96 + 48 * i,
			 96 + 48 * i + 47);
	}
	snprintf(t->binding, sizeof t->binding, "0-191");
	t->binding_pus = 192;
	t->binding_node = -1;
	snprintf(p->backend, sizeof p->backend, "cuda");
	p->have_gpu = true;
	snprintf(p->gpu.name, sizeof p->gpu.name, "NVIDIA H200 \"NVL\" \xc3\xa9");
	snprintf(p->gpu.pci_bus_id, sizeof p->gpu.pci_bus_id, "0000:65:00.0");
	p->gpu.memory_bytes = 150754820096ull;
	p->gpu.numa_node = 1;
	p->pinned_node = 1;
	p->io_node = 0;
	p->threads = 96;
	p->mem_read_gbps = 0.1 + 0.2;
	p->mem_bytes = 512ull << 20;
	p->cpu_gemm_gflops = 1234.5678901234567;
	p->cpu_gemm_m = 512;
	p->cpu_gemm_n = p->cpu_gemm_k = 2048;
	p->disk_read_gbps = 6.02214076e-3;
	snprintf(p->disk_engine, sizeof p->disk_engine, "io_uring+O_DIRECT");
	p->disk_bytes = 1ull << 30;
	snprintf(p->offload_dir, sizeof p->offload_dir, "/mnt/nvme/sluice dir");
	p->h2d_gbps = 53.123456789;
	p->d2h_gbps = 1.0 / 3.0;
	p->copy_bytes = 256ull << 20;
	p->gpu_gemm_tflops = 712.25;
	p->gpu_gemm_m = 4096;
	p->gpu_gemm_n = p->gpu_gemm_k = 8192;
	/* format 2 */
	p->gemm.n = p->gemm.k = 8192;
	p->gemm.npoints = 11;
	for (int i = 0; i < 11; i++) {
		p->gemm.m[i] = 1 << i;
		p->gemm.gflops[i] = 3.0 * (1 << i) / 7.0 + 0.1;
	}
	p->gemm_q4 = p->gemm;
	for (int i = 0; i < 11; i++)
		p->gemm_q4.gflops[i] = 2.0 * (1 << i) / 7.0 + 0.3;
	p->gemm_hot = p->gemm;
	for (int i = 0; i < 11; i++)
		p->gemm_hot.gflops[i] = 5.0 * (1 << i) / 7.0 + 0.2;
	p->llc_bytes = 300ull << 20;
	p->llc_hot_bytes = 64ull << 20;
	p->n_gemm_shapes = 2;
	p->gemm_shapes[0] = (sl_profile_curve){ .npoints = 4, .n = 768, .k = 3072, .m = { 1, 8, 64, 512 },
						.gflops = { 0.1 + 0.2, 50.0 / 3, 200.5, 1e3 / 7 } };
	p->gemm_shapes[1] = (sl_profile_curve){ .npoints = 2, .n = 50272, .k = 768, .m = { 1, 8 },
						.gflops = { 5.0 / 9, 61.25 } };
	p->copy_gbps = 51.000000000000007;
	p->copy_latency_us = 4.4;
	p->op_latency_us = 0.1 + 0.7;
	p->attn_decode_gbps = 2345.678;
	p->attn_prefill_gflops = 98765.4321;
	p->cpu_attn_gbps = 12.3456789;
	p->disk_write_gbps = 2.0 / 3.0;
	p->copy_overlap = 1.0 / 3.0;
	p->zstd_gbps = 1.0 / 7.0;
	p->zstd_ratio = 0.8125 + 1e-9;
	p->disk_passes = 3;
	p->disk_read_spread = 0.1 + 0.025;
	p->disk_seg.npoints = 5;
	p->disk_seg.outstanding = 2;
	for (int i = 0; i < 5; i++) {
		p->disk_seg.bytes[i] = (uint64_t)256 << (10 + 2 * i); /* 256 KiB to 64 MiB */
		p->disk_seg.gbps[i] = 0.3 + i / 7.0;
		p->disk_seg.spread[i] = i / 9.0;
	}
	p->disk_page_write_gbps = 0.0625 / 3;
	p->have_disk_overlap = true;
	p->disk_overlap = 0.2 + 0.05;
	p->load_average = 2.75;
	p->dev_reserve_bytes = 33554432 + 4096;
	p->fit_prefill = 1.125 + 1e-9;
	p->fit_decode = 0.875 / 3;
	p->fit_hot_n = 2;
	p->fit_hot_m[0] = 1;
	p->fit_hot_m[1] = 4;
	p->fit_hot_share[0] = 0.5 / 3;
	p->fit_hot_share[1] = 1;
	snprintf(p->fit_model, sizeof p->fit_model, "opt-350m");
	snprintf(p->cpu_gemm, sizeof p->cpu_gemm, "bf16");
	snprintf(p->build, sizeof p->build, "0.1.0");
	snprintf(p->machine, sizeof p->machine, "backend=cuda; threads=96; build=0.1.0; cpu=AMD EPYC \"9654\"; "
		 "pus=192; gpu=NVIDIA H200");
	p->seconds = 2.718281828459045;
}

/* Nothing optional: a CPU machine, no disk measured, nodes unknown. */
static void bare_profile(sl_profile *p)
{
	memset(p, 0, sizeof *p);
	p->topo.loaded = false;
	p->topo.cores = p->topo.pus = 2;
	p->topo.nnodes = 1;
	p->topo.node[0].cores = p->topo.node[0].pus = 2;
	snprintf(p->topo.binding, sizeof p->topo.binding, "0-1");
	p->topo.binding_pus = 2;
	p->topo.binding_node = -1;
	snprintf(p->backend, sizeof p->backend, "cpu");
	p->gpu.numa_node = -1;
	p->pinned_node = p->io_node = -1;
	p->threads = 1;
	p->mem_read_gbps = 9.5;
	p->mem_bytes = 16ull << 20;
	p->cpu_gemm_gflops = 3.25;
	p->cpu_gemm_m = 64;
	p->cpu_gemm_n = p->cpu_gemm_k = 256;
}

#define SAME(f) ck_assert_msg(a->f == b->f, "%s differs after the round trip", #f)
#define SAME_STR(f) ck_assert_msg(!strcmp(a->f, b->f), "%s: '%s' read back as '%s'", #f, a->f, b->f)
#define SAME_BITS(f) ck_assert_msg(!memcmp(&a->f, &b->f, sizeof a->f), "%s: %.17g read back as %.17g", #f, a->f, b->f)

static void check_same(const sl_profile *a, const sl_profile *b)
{
	SAME(quick);
	SAME(topo.loaded);
	SAME(topo.packages);
	SAME(topo.cores);
	SAME(topo.pus);
	SAME(topo.nnodes);
	for (int i = 0; i < SL_MIN(a->topo.nnodes, SL_PROFILE_MAX_NODES); i++) {
		SAME(topo.node[i].os_index);
		SAME(topo.node[i].memory_bytes);
		SAME(topo.node[i].cores);
		SAME(topo.node[i].pus);
		SAME_STR(topo.node[i].cpus);
	}
	SAME_STR(topo.binding);
	SAME(topo.binding_pus);
	SAME(topo.binding_node);
	SAME_STR(backend);
	SAME(have_gpu);
	if (a->have_gpu) {
		SAME_STR(gpu.name);
		SAME_STR(gpu.pci_bus_id);
		SAME(gpu.memory_bytes);
		SAME(gpu.numa_node);
	}
	SAME(pinned_node);
	SAME(io_node);
	SAME(threads);
	SAME_BITS(mem_read_gbps);
	SAME(mem_bytes);
	SAME_BITS(cpu_gemm_gflops);
	SAME(cpu_gemm_m);
	SAME(cpu_gemm_n);
	SAME(cpu_gemm_k);
	SAME_BITS(disk_read_gbps);
	SAME_STR(disk_engine);
	SAME(disk_bytes);
	SAME_STR(offload_dir);
	SAME_BITS(h2d_gbps);
	SAME_BITS(d2h_gbps);
	SAME(copy_bytes);
	SAME_BITS(gpu_gemm_tflops);
	SAME(gpu_gemm_m);
	SAME(gpu_gemm_n);
	SAME(gpu_gemm_k);
	SAME(gemm.npoints);
	SAME(gemm.n);
	SAME(gemm.k);
	for (int i = 0; i < a->gemm.npoints; i++) {
		SAME(gemm.m[i]);
		SAME_BITS(gemm.gflops[i]);
	}
	SAME(gemm_q4.npoints);
	for (int i = 0; i < a->gemm_q4.npoints; i++) {
		SAME(gemm_q4.n);
		SAME(gemm_q4.k);
		SAME(gemm_q4.m[i]);
		SAME_BITS(gemm_q4.gflops[i]);
	}
	SAME(gemm_hot.npoints);
	SAME(gemm_hot.n);
	SAME(gemm_hot.k);
	for (int i = 0; i < a->gemm_hot.npoints; i++) {
		SAME(gemm_hot.m[i]);
		SAME_BITS(gemm_hot.gflops[i]);
	}
	SAME(llc_bytes);
	SAME(llc_hot_bytes);
	SAME(n_gemm_shapes);
	for (int s = 0; s < a->n_gemm_shapes; s++) {
		SAME(gemm_shapes[s].npoints);
		SAME(gemm_shapes[s].n);
		SAME(gemm_shapes[s].k);
		for (int i = 0; i < a->gemm_shapes[s].npoints; i++) {
			SAME(gemm_shapes[s].m[i]);
			SAME_BITS(gemm_shapes[s].gflops[i]);
		}
	}
	SAME_BITS(copy_gbps);
	SAME_BITS(copy_latency_us);
	SAME_BITS(op_latency_us);
	SAME_BITS(attn_decode_gbps);
	SAME_BITS(attn_prefill_gflops);
	SAME_BITS(cpu_attn_gbps);
	SAME_BITS(disk_write_gbps);
	SAME_BITS(copy_overlap);
	SAME_BITS(zstd_gbps);
	SAME_BITS(zstd_ratio);
	SAME(disk_passes);
	SAME_BITS(disk_read_spread);
	SAME(disk_seg.npoints);
	if (a->disk_seg.npoints)
		SAME(disk_seg.outstanding);
	for (int i = 0; i < a->disk_seg.npoints; i++) {
		SAME(disk_seg.bytes[i]);
		SAME_BITS(disk_seg.gbps[i]);
		SAME_BITS(disk_seg.spread[i]);
	}
	SAME_BITS(disk_page_write_gbps);
	SAME(have_disk_overlap);
	SAME_BITS(disk_overlap);
	SAME_BITS(load_average);
	SAME(dev_reserve_bytes);
	SAME_BITS(fit_prefill);
	SAME_BITS(fit_decode);
	SAME(fit_hot_n);
	for (int i = 0; i < a->fit_hot_n; i++) {
		SAME(fit_hot_m[i]);
		SAME_BITS(fit_hot_share[i]);
	}
	SAME_STR(fit_model);
	SAME_STR(cpu_gemm);
	SAME_STR(build);
	SAME_STR(machine);
	SAME_BITS(seconds);
}

static void round_trip(const sl_profile *p, const char *name)
{
	char path[128];
	snprintf(path, sizeof path, "%s/%s.json", tmpdir, name);
	ck_assert_msg(sl_profile_save_json(p, path) == 0, "save %s: %s", name, sl_errmsg());
	sl_profile *q = malloc(sizeof *q);
	memset(q, 0xa5, sizeof *q); /* every field must be set by the load */
	ck_assert_msg(sl_profile_load(path, q) == 0, "load %s: %s", name, sl_errmsg());
	check_same(p, q);
	free(q);
}

START_TEST(test_round_trip)
{
	make_tmpdir();
	sl_profile *p = malloc(sizeof *p);
	full_profile(p);
	round_trip(p, "full");
	bare_profile(p);
	round_trip(p, "bare");
	/* a machine of 70 nodes: 64 listed, 70 counted */
	full_profile(p);
	p->topo.nnodes = 70;
	for (int i = 0; i < SL_PROFILE_MAX_NODES; i++) {
		p->topo.node[i].os_index = i;
		p->topo.node[i].memory_bytes = (uint64_t)i << 30;
		p->topo.node[i].cores = p->topo.node[i].pus = i % 3;
		snprintf(p->topo.node[i].cpus, sizeof p->topo.node[i].cpus, "%d", i);
	}
	round_trip(p, "many_nodes");

	/* copy_overlap came after format 2's other fields: a file without it
	 * (or with null) loads, as 0 */
	full_profile(p);
	char path[128];
	snprintf(path, sizeof path, "%s/no-overlap.json", tmpdir);
	ck_assert_int_eq(sl_profile_save_json(p, path), 0);
	json_t *root = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(root);
	ck_assert_int_eq(json_object_del(root, "copy_overlap"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	sl_profile *q = malloc(sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	p->copy_overlap = 0;
	check_same(p, q);
	/* load_average, also later: absent is unknown (-1) */
	ck_assert_int_eq(json_object_del(root, "load_average"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	ck_assert(q->load_average == -1);
	p->load_average = -1;
	check_same(p, q);
	/* the zstd frames' rate and ratio, later again: absent is 0 */
	ck_assert_int_eq(json_object_del(root, "zstd_gbps"), 0);
	ck_assert_int_eq(json_object_del(root, "zstd_ratio"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	p->zstd_gbps = p->zstd_ratio = 0;
	check_same(p, q);
	/* sluice profile --fit, later again: absent is not fitted (0, "") */
	ck_assert_int_eq(json_object_del(root, "fit_prefill"), 0);
	ck_assert_int_eq(json_object_del(root, "fit_decode"), 0);
	ck_assert_int_eq(json_object_del(root, "fit_model"), 0);
	ck_assert_int_eq(json_object_del(root, "fit_hot"), 0);
	ck_assert_int_eq(json_object_del(root, "cpu_gemm"), 0); /* and the GEMM: "" (sluice's) */
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	memset(q, 0xa5, sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	p->fit_prefill = p->fit_decode = 0;
	p->fit_hot_n = 0;
	p->fit_model[0] = p->cpu_gemm[0] = 0;
	check_same(p, q);
	json_object_set_new(root, "copy_overlap", json_null());
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	/* gemm_q4 (compress_weight's GEMM), later still: absent or null, not
	 * measured (no points) */
	ck_assert_int_eq(json_object_del(root, "gemm_q4"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	memset(q, 0xa5, sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(q->gemm_q4.npoints, 0);
	memset(&p->gemm_q4, 0, sizeof p->gemm_q4);
	check_same(p, q);
	json_object_set_new(root, "gemm_q4", json_null());
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	/* gemm_shapes (a model's own GEMM shapes), later again: absent,
	 * null or empty, none */
	ck_assert_int_eq(json_object_del(root, "gemm_shapes"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	memset(q, 0xa5, sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(q->n_gemm_shapes, 0);
	p->n_gemm_shapes = 0;
	check_same(p, q);
	json_object_set_new(root, "gemm_shapes", json_null());
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	json_object_set_new(root, "gemm_shapes", json_array());
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	/* gemm_hot and llc_bytes (the cache), later still: absent or null, none */
	ck_assert_int_eq(json_object_del(root, "gemm_hot"), 0);
	ck_assert_int_eq(json_object_del(root, "llc_bytes"), 0);
	ck_assert_int_eq(json_object_del(root, "llc_hot_bytes"), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	memset(q, 0xa5, sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(q->gemm_hot.npoints, 0);
	ck_assert_uint_eq(q->llc_bytes, 0);
	ck_assert_uint_eq(q->llc_hot_bytes, 0);
	memset(&p->gemm_hot, 0, sizeof p->gemm_hot);
	p->llc_bytes = 0;
	p->llc_hot_bytes = 0;
	check_same(p, q);
	json_object_set_new(root, "gemm_hot", json_null());
	json_object_set_new(root, "llc_bytes", json_null());
	json_object_set_new(root, "llc_hot_bytes", json_null());
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	/* the disk's patterns, later still: a file without them (or with
	 * null) loads as one pass, no curve, no page rate, the disk hidden
	 * wholly (have_disk_overlap false): the model as before them */
	static const char *const disk_fields[] = { "disk_passes", "disk_read_spread", "disk_segment_read",
						   "disk_page_write_gbps", "disk_overlap" };
	p->disk_passes = 0;
	p->disk_read_spread = 0;
	memset(&p->disk_seg, 0, sizeof p->disk_seg);
	p->disk_page_write_gbps = 0;
	p->have_disk_overlap = false;
	p->disk_overlap = 0;
	for (int nul = 0; nul < 2; nul++) {
		for (size_t i = 0; i < SL_ARRAY_LEN(disk_fields); i++) {
			if (nul)
				json_object_set_new(root, disk_fields[i], json_null());
			else
				ck_assert_int_eq(json_object_del(root, disk_fields[i]), 0);
		}
		ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
		memset(q, 0xa5, sizeof *q);
		ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
		check_same(p, q);
		ck_assert(!q->have_disk_overlap && q->disk_seg.npoints == 0);
	}
	/* a measured overlap of 0 is not "not measured" */
	json_object_set_new(root, "disk_overlap", json_real(0));
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	ck_assert(q->have_disk_overlap && q->disk_overlap == 0);
	json_decref(root);
	free(q);
	free(p);
	remove_tmpdir();
}
END_TEST

/* ---- malformed profiles ---------------------------------------------------------- */

/* The value at a dotted place ("topology.numa_nodes.1.cores") set to v,
 * or removed where v is NULL. */
static void set_at(json_t *root, const char *place, json_t *v)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", place);
	json_t *cur = root;
	char *key = buf, *dot;
	while ((dot = strchr(key, '.'))) {
		*dot = 0;
		cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(key)) : json_object_get(cur, key);
		ck_assert_msg(cur != NULL, "no %s in the profile", place);
		key = dot + 1;
	}
	if (json_is_array(cur)) {
		ck_assert_ptr_nonnull(v);
		ck_assert_int_eq(json_array_set_new(cur, (size_t)atoi(key), v), 0);
	} else if (v) {
		ck_assert_int_eq(json_object_set_new(cur, key, v), 0);
	} else {
		ck_assert_int_eq(json_object_del(cur, key), 0);
	}
}

typedef struct bad_case {
	const char *place; /* where the change is */
	const char *value; /* the new value as JSON text; NULL: the field removed;
			    * "@300 x": a string of 300 x */
	int code;
	const char *says;  /* in the message, after "PATH: " */
} bad_case;

static const bad_case bad_cases[] = {
	{ "threads", NULL, SL_EFORMAT, "threads is missing" },
	{ "threads", "\"96\"", SL_EFORMAT, "threads must be an integer, got a string" },
	{ "threads", "0", SL_ERANGE, "threads = 0, must be in [1, " },
	{ "quick", "1", SL_EFORMAT, "quick must be true or false, got an integer" },
	{ "backend", "null", SL_EFORMAT, "backend must be a string, got null" },
	{ "mem_read_gbps", "-1.5", SL_ERANGE, "mem_read_gbps = -1.5, must be a positive number or null" },
	{ "h2d_gbps", "\"fast\"", SL_EFORMAT, "h2d_gbps must be a positive number or null, got a string" },
	{ "disk_probe_bytes", "-4096", SL_ERANGE, "disk_probe_bytes = -4096, must be in [1, " },
	{ "pinned_numa_node", "1.5", SL_EFORMAT, "pinned_numa_node must be an integer or null, got a number" },
	{ "topology", "[]", SL_EFORMAT, "topology must be an object, got an array" },
	{ "topology.numa_nodes.1.cores", "\"48\"", SL_EFORMAT,
	  "topology.numa_nodes[1].cores must be an integer, got a string" },
	{ "topology.numa_nodes.0.cpus", NULL, SL_EFORMAT, "topology.numa_nodes[0].cpus is missing" },
	{ "topology.numa_nodes.1", "7", SL_EFORMAT, "topology.numa_nodes[1] must be an object, got an integer" },
	{ "topology.numa_node_count", "3", SL_EFORMAT,
	  "topology.numa_nodes lists 2 nodes, numa_node_count 3 needs 3" },
	{ "topology.binding_node", "-2", SL_ERANGE, "topology.binding_node = -2, must be in [0, " },
	{ "gpu", "5", SL_EFORMAT, "gpu must be an object or null, got an integer" },
	{ "gpu.name", "@300 x",
	  SL_EFORMAT, "gpu.name is longer than 255 bytes" },
	{ "cpu_gemm_shape.k", "0", SL_ERANGE, "cpu_gemm_shape.k = 0, must be in [1, " },
	{ "seconds", "-1", SL_ERANGE, "seconds = -1, must be at least 0" },
	{ "format", "\"sluice-policy\"", SL_EFORMAT, "not a sluice profile" },
	{ "format_version", "3", SL_EUNSUPPORTED, "format_version 3, this sluice reads versions 1 to 2" },
	/* format 2: the GEMM curve and the cost model's rates */
	{ "gemm", "[]", SL_EFORMAT, "gemm must be an object or null, got an array" },
	{ "gemm.n", "0", SL_ERANGE, "gemm.n = 0, must be in [1, " },
	{ "gemm.k", NULL, SL_EFORMAT, "gemm.k is missing" },
	{ "gemm.m", "{}", SL_EFORMAT, "gemm.m must be an array, got an object" },
	{ "gemm.gflops", "3.5", SL_EFORMAT, "gemm.gflops must be an array, got a number" },
	{ "gemm.m", "[]", SL_EFORMAT, "gemm.m lists 0 points, must list 1 to 16" },
	{ "gemm.gflops", "[1.5, 2.5]", SL_EFORMAT, "gemm.gflops lists 2 points, gemm.m 11" },
	{ "gemm.m.2", "\"4\"", SL_EFORMAT, "gemm.m[2] must be an integer, got a string" },
	{ "gemm.m.3", "4", SL_ERANGE, "gemm.m[3] = 4, must be more than 4 (increasing, from 1)" },
	{ "gemm.m.0", "0", SL_ERANGE, "gemm.m[0] = 0, must be more than 0 (increasing, from 1)" },
	{ "gemm.gflops.5", "null", SL_EFORMAT, "gemm.gflops[5] must be a positive number, got null" },
	{ "gemm.gflops.1", "-2", SL_ERANGE, "gemm.gflops[1] = -2, must be a positive number" },
	{ "copy_latency_us", "-0.5", SL_ERANGE, "copy_latency_us = -0.5, must be a positive number or null" },
	{ "attn_decode_gbps", "true", SL_EFORMAT, "attn_decode_gbps must be a positive number or null, got true" },
	{ "disk_write_gbps", NULL, SL_EFORMAT, "disk_write_gbps is missing" },
	{ "load_average", "-1", SL_ERANGE, "load_average = -1, must be at least 0" },
	{ "load_average", "\"high\"", SL_EFORMAT, "load_average must be a number or null, got a string" },
	{ "copy_overlap", "1.5", SL_ERANGE, "copy_overlap = 1.5, must be in [0, 1]" },
	{ "copy_overlap", "-0.25", SL_ERANGE, "copy_overlap = -0.25, must be in [0, 1]" },
	{ "copy_overlap", "\"all\"", SL_EFORMAT, "copy_overlap must be a number in [0, 1] or null, got a string" },
	{ "zstd_gbps", "0", SL_ERANGE, "zstd_gbps = 0, must be a positive number or null" },
	{ "zstd_ratio", "1.25", SL_ERANGE, "zstd_ratio = 1.25, must be in [0, 1]" },
	/* the disk's patterns */
	{ "disk_passes", "0", SL_ERANGE, "disk_passes = 0, must be in [1, 1000]" },
	{ "disk_passes", "2.5", SL_EFORMAT, "disk_passes must be an integer or null, got a number" },
	{ "disk_read_spread", "-0.5", SL_ERANGE, "disk_read_spread = -0.5, must be at least 0" },
	{ "disk_segment_read", "3", SL_EFORMAT, "disk_segment_read must be an object or null, got an integer" },
	{ "disk_segment_read.outstanding", "0", SL_ERANGE, "disk_segment_read.outstanding = 0, must be in [1, 4096]" },
	{ "disk_segment_read.bytes", "[]", SL_EFORMAT, "disk_segment_read.bytes lists 0 points, must list 1 to 8" },
	{ "disk_segment_read.spread", NULL, SL_EFORMAT, "disk_segment_read.spread is missing" },
	{ "disk_segment_read.gbps", "[1, 2]", SL_EFORMAT,
	  "disk_segment_read.gbps lists 2 points, disk_segment_read.bytes 5" },
	{ "disk_segment_read.bytes.2", "1048576", SL_ERANGE,
	  "disk_segment_read.bytes[2] = 1048576, must be a multiple of 4096 above 1048576 (increasing)" },
	{ "disk_segment_read.bytes.0", "1000", SL_ERANGE,
	  "disk_segment_read.bytes[0] = 1000, must be a multiple of 4096 above 0 (increasing)" },
	{ "disk_segment_read.bytes.1", "\"1M\"", SL_EFORMAT, "disk_segment_read.bytes[1] must be an integer, got a string" },
	{ "disk_segment_read.gbps.3", "0", SL_ERANGE, "disk_segment_read.gbps[3] = 0, must be a positive number" },
	{ "disk_segment_read.spread.4", "-1", SL_ERANGE, "disk_segment_read.spread[4] = -1, must be at least 0" },
	{ "disk_segment_read.spread.0", "null", SL_EFORMAT, "disk_segment_read.spread[0] must be a number, got null" },
	{ "disk_page_write_gbps", "-2", SL_ERANGE, "disk_page_write_gbps = -2, must be a positive number or null" },
	{ "disk_overlap", "1.25", SL_ERANGE, "disk_overlap = 1.25, must be in [0, 1]" },
	{ "disk_overlap", "\"half\"", SL_EFORMAT, "disk_overlap must be a number in [0, 1] or null, got a string" },
	{ "dev_reserve_bytes", "-1", SL_ERANGE, "dev_reserve_bytes = -1, must be in [0, " },
	{ "dev_reserve_bytes", "null", SL_EFORMAT, "dev_reserve_bytes must be an integer, got null" },
	{ "machine", "7", SL_EFORMAT, "machine must be a string or null, got an integer" },
	{ "build", "@300 x", SL_EFORMAT, "build is longer than 63 bytes" },
	{ "format_version", "\"1\"", SL_EFORMAT, "format_version must be an integer, got a string" },
	/* the model's own GEMM shapes */
	{ "gemm_shapes", "{}", SL_EFORMAT, "gemm_shapes must be an array, got an object" },
	{ "gemm_shapes.1", "3", SL_EFORMAT, "gemm_shapes[1] must be an object, got an integer" },
	{ "gemm_shapes.1.k", NULL, SL_EFORMAT, "gemm_shapes[1].k is missing" },
	{ "gemm_shapes.0.gflops.2", "0", SL_ERANGE, "gemm_shapes[0].gflops[2] = 0, must be a positive number" },
	{ "gemm_shapes.1.m", "[8, 1]", SL_ERANGE, "gemm_shapes[1].m[1] = 1, must be more than 8 (increasing, from 1)" },
	/* the cache: the hot curve and its size */
	{ "gemm_hot", "7", SL_EFORMAT, "gemm_hot must be an object or null, got an integer" },
	{ "gemm_hot.gflops.0", "-1", SL_ERANGE, "gemm_hot.gflops[0] = -1, must be a positive number" },
	{ "llc_bytes", "0", SL_ERANGE, "llc_bytes = 0, must be in [1, " },
	{ "llc_hot_bytes", "-64", SL_ERANGE, "llc_hot_bytes = -64, must be in [1, " },
	{ "llc_hot_bytes", "\"64M\"", SL_EFORMAT, "llc_hot_bytes must be an integer or null, got a string" },
	/* sluice profile --fit */
	{ "fit_prefill", "0", SL_ERANGE, "fit_prefill = 0, must be a positive number or null" },
	{ "fit_decode", "\"1.1\"", SL_EFORMAT, "fit_decode must be a positive number or null, got a string" },
	{ "fit_model", "@300 x", SL_EFORMAT, "fit_model is longer than 63 bytes" },
	{ "fit_hot", "7", SL_EFORMAT, "fit_hot must be an object or null, got an integer" },
	{ "fit_hot.share.0", "1.5", SL_ERANGE, "fit_hot.share[0] = 1.5, must be in [0, 1]" },
	{ "fit_hot.share.1", "-0.25", SL_ERANGE, "fit_hot.share[1] = -0.25, must be at least 0" },
	{ "fit_hot.m", "[4, 1]", SL_EFORMAT, "fit_hot.m[1] must be an integer above 4 (increasing)" },
	{ "fit_hot.share", "[0.5]", SL_EFORMAT, "fit_hot.share lists 1 points, fit_hot.m 2" },
	{ "cpu_gemm", "3", SL_EFORMAT, "cpu_gemm must be a string or null, got an integer" },
	{ "llc_bytes", "\"300M\"", SL_EFORMAT, "llc_bytes must be an integer or null, got a string" },
};

START_TEST(test_malformed)
{
	const bad_case *c = &bad_cases[_i];
	make_tmpdir();
	char good[128], path[128];
	snprintf(good, sizeof good, "%s/good.json", tmpdir);
	snprintf(path, sizeof path, "%s/bad.json", tmpdir);
	sl_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q), *before = malloc(sizeof *before);
	full_profile(p);
	ck_assert_int_eq(sl_profile_save_json(p, good), 0);
	json_t *root = json_load_file(good, 0, NULL);
	ck_assert_ptr_nonnull(root);
	json_t *v = NULL;
	if (c->value && !strcmp(c->value, "@300 x")) {
		char x[301];
		memset(x, 'x', 300);
		x[300] = 0;
		v = json_string(x);
	} else if (c->value) {
		v = json_loads(c->value, JSON_DECODE_ANY, NULL);
		ck_assert_msg(v != NULL, "case %d: bad JSON in the test", _i);
	}
	set_at(root, c->place, v);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	json_decref(root);

	memset(q, 0x3c, sizeof *q);
	memcpy(before, q, sizeof *q);
	const int rc = sl_profile_load(path, q);
	const char *msg = sl_errmsg();
	char want[256];
	snprintf(want, sizeof want, "%s: %s", path, c->says);
	ck_assert_msg(rc == c->code, "%s = %s: code %d, want %d (%s)", c->place, c->value ? c->value : "(removed)", rc,
		      c->code, msg);
	ck_assert_msg(strstr(msg, want) != NULL, "%s: the message '%s' does not say '%s'", c->place, msg, want);
	ck_assert_msg(!strchr(msg, '\n'), "%s: the message is not one line: '%s'", c->place, msg);
	ck_assert_msg(!memcmp(q, before, sizeof *q), "%s: the destination was changed by a failed load", c->place);
	free(p);
	free(q);
	free(before);
	remove_tmpdir();
}
END_TEST

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void expect_refused(const char *path, int code, const char *says)
{
	sl_profile *q = malloc(sizeof *q);
	const int rc = sl_profile_load(path, q);
	const char *msg = sl_errmsg();
	ck_assert_msg(rc == code, "%s: code %d, want %d (%s)", path, rc, code, msg);
	ck_assert_msg(strstr(msg, path) && strstr(msg, says), "%s: the message '%s' does not say '%s'", path, msg,
		      says);
	ck_assert_msg(!strchr(msg, '\n'), "the message is not one line: '%s'", msg);
	free(q);
}

START_TEST(test_files)
{
	make_tmpdir();
	char path[128];
	snprintf(path, sizeof path, "%s/none.json", tmpdir);
	expect_refused(path, SL_ENOTFOUND, "no such profile file");
	expect_refused(tmpdir, SL_EIO, "is a directory");
	snprintf(path, sizeof path, "%s/text.json", tmpdir);
	write_text(path, "{\n  \"format\": \"sluice-profile\",\n  oops\n}\n");
	expect_refused(path, SL_EFORMAT, ":3: not valid JSON (line 3,");
	write_text(path, "[1, 2]\n");
	expect_refused(path, SL_EFORMAT, "not a sluice profile");

	/* a field a later sluice adds is ignored */
	sl_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q);
	bare_profile(p);
	snprintf(path, sizeof path, "%s/later.json", tmpdir);
	ck_assert_int_eq(sl_profile_save_json(p, path), 0);
	json_t *root = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(root);
	json_object_set_new(root, "nvlink_gbps", json_real(450.0));
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	json_decref(root);
	ck_assert_msg(sl_profile_load(path, q) == 0, "%s", sl_errmsg());
	check_same(p, q);
	free(p);
	free(q);
	remove_tmpdir();
}
END_TEST

/* A format 1 file, as the sluice before the cost model wrote it: the same
 * fields but format 2's; it reads, those fields 0.  A format 2 field in a
 * format 1 file means nothing and is not read. */
START_TEST(test_format_1)
{
	make_tmpdir();
	char path[128];
	snprintf(path, sizeof path, "%s/v1.json", tmpdir);
	sl_profile *p = malloc(sizeof *p), *q = malloc(sizeof *q);
	full_profile(p);
	ck_assert_int_eq(sl_profile_save_json(p, path), 0);
	json_t *root = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(root);
	ck_assert_int_eq(json_integer_value(json_object_get(root, "format_version")), 2);
	json_object_set_new(root, "format_version", json_integer(1));
	static const char *const v2[] = { "build", "machine", "gemm", "copy_gbps", "copy_latency_us",
					  "op_latency_us", "attn_decode_gbps", "attn_prefill_gflops",
					  "cpu_attn_gbps", "disk_write_gbps", "dev_reserve_bytes", "gemm_q4",
					  "gemm_shapes", "gemm_hot", "llc_bytes", "llc_hot_bytes" };
	for (size_t i = 0; i < SL_ARRAY_LEN(v2); i++)
		ck_assert_int_eq(json_object_del(root, v2[i]), 0);
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	memset(q, 0xa5, sizeof *q);
	ck_assert_msg(sl_profile_load(path, q) == 0, "a format 1 file: %s", sl_errmsg());
	/* what format 1 holds reads back; the rest is 0 */
	sl_profile *want = malloc(sizeof *want);
	*want = *p;
	memset(&want->gemm, 0, sizeof want->gemm);
	memset(&want->gemm_q4, 0, sizeof want->gemm_q4);
	want->n_gemm_shapes = 0;
	memset(&want->gemm_hot, 0, sizeof want->gemm_hot);
	want->llc_bytes = 0;
	want->llc_hot_bytes = 0;
	want->copy_gbps = want->copy_latency_us = want->op_latency_us = 0;
	want->attn_decode_gbps = want->attn_prefill_gflops = want->cpu_attn_gbps = want->disk_write_gbps = 0;
	want->dev_reserve_bytes = 0;
	want->copy_overlap = 0;
	want->zstd_gbps = want->zstd_ratio = 0;
	want->disk_passes = 0;
	want->disk_read_spread = 0;
	memset(&want->disk_seg, 0, sizeof want->disk_seg);
	want->disk_page_write_gbps = 0;
	want->have_disk_overlap = false;
	want->disk_overlap = 0;
	want->load_average = -1;
	want->fit_prefill = want->fit_decode = 0;
	want->fit_hot_n = 0;
	want->fit_model[0] = want->cpu_gemm[0] = 0;
	want->build[0] = want->machine[0] = 0;
	check_same(want, q);
	for (int i = 0; i < SL_PROFILE_CURVE_MAX; i++)
		ck_assert(q->gemm.m[i] == 0 && q->gemm.gflops[i] == 0);

	/* format 2's fields, malformed, in a format 1 file: not read */
	json_object_set_new(root, "gemm", json_string("fast"));
	json_object_set_new(root, "copy_gbps", json_integer(-3));
	ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(2)), 0);
	ck_assert_msg(sl_profile_load(path, q) == 0, "a format 1 file: %s", sl_errmsg());
	check_same(want, q);
	json_decref(root);
	free(want);
	free(p);
	free(q);
	remove_tmpdir();
}
END_TEST

START_TEST(test_median)
{
	double one[] = { 4.0 }, odd[] = { 9.0, 1.0, 5.0, 3.0, 7.0 }, even[] = { 8.0, 2.0, 6.0, 4.0 },
	       ties[] = { 2.0, 1.0, 2.0 };
	ck_assert_double_eq(sl_median(one, 1), 4.0);
	ck_assert_double_eq(sl_median(odd, 5), 5.0);
	ck_assert_double_eq(sl_median(even, 4), 5.0);
	ck_assert_double_eq(sl_median(ties, 3), 2.0);
	ck_assert_double_eq(odd[0], 1.0); /* sorted in place, as documented */
	ck_assert_double_eq(odd[4], 9.0);
}
END_TEST

static Suite *profile_suite(void)
{
	Suite *s = suite_create("profile");
	TCase *tc = tcase_create("profile");
	tcase_add_test(tc, test_round_trip);
	tcase_add_loop_test(tc, test_malformed, 0, (int)SL_ARRAY_LEN(bad_cases));
	tcase_add_test(tc, test_files);
	tcase_add_test(tc, test_format_1);
	tcase_add_test(tc, test_median);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return sl_test_run(profile_suite());
}
