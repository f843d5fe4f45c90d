/*
 * test_topology.c - offload/topology.c: the machine as hwloc describes it,
 * thread binding and the disk store's I/O threads on a node.
 *
 * On this machine: the description agrees with the kernel (PUs, the
 * process's affinity), binding to the process's own node succeeds and reads
 * back, unknown PCI devices have no node, and with one node memory binding
 * is a no-op.
 *
 * On a made-up machine (FIXTURES/topology-2node.xml: two nodes of one PU
 * each, PUs 0 and 1, a GPU at 0000:65:00.0 on node 1, a disk controller on
 * the machine itself), loaded through HWLOC_XMLFILE with HWLOC_THISSYSTEM=1
 * so that binding calls reach the kernel: node memory and cores, the GPU's
 * node, the I/O node, binding a thread to node 1 and to node 0 (checked
 * with sched_getaffinity), a bad node warning once, and a disk store whose
 * I/O threads (io_uring and the thread pool) bind to node 1 while the
 * caller stays unbound.  Needs PUs 0 and 1 in this process's affinity:
 * the group 'two_nodes' is its own meson test, which exits 77 (SKIP) with
 * the reason where they are not.  Each test runs in its own process (Check's fork
 * mode), so each loads the topology its environment names.
 */
#include "disk_store.h"
#include "sl_common.h"
#include "testutil.h"
#include "topology.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fixtures;
static char tmp_root[256];

static int affinity(cpu_set_t *cs)
{
	CPU_ZERO(cs);
	ck_assert_int_eq(sched_getaffinity(0, sizeof *cs, cs), 0);
	return CPU_COUNT(cs);
}

/* ---- this machine ------------------------------------------------------------ */

/* The size of cpu0's cache of the given level as Linux's sysfs says (the
 * unified one), 0 where it says none. */
static uint64_t sysfs_cache(int level)
{
	for (int i = 0; i < 8; i++) {
		char path[128], buf[64];
		unsigned long long v = 0;
		int lv = -1;
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		FILE *f = fopen(path, "r");
		if (!f)
			break;
		if (fscanf(f, "%d", &lv) != 1)
			lv = -1;
		fclose(f);
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
		f = fopen(path, "r");
		const bool unified = f && fgets(buf, sizeof buf, f) && !strncmp(buf, "Unified", 7);
		if (f)
			fclose(f);
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "r");
		if (f && lv == level && unified && fscanf(f, "%lluK", &v) == 1) {
			fclose(f);
			return (uint64_t)v << 10;
		}
		if (f)
			fclose(f);
	}
	return 0;
}

START_TEST(test_here)
{
	sl_topo_info t;
	ck_assert_msg(sl_topo_get(&t) == 0, "%s", sl_errmsg());
	ck_assert(t.loaded);
	ck_assert_int_ge(t.nnodes, 1);
	ck_assert_int_ge(t.pus, 1);
	ck_assert_int_ge(t.cores, 1);
	ck_assert_int_le(t.cores, t.pus);
	ck_assert_int_eq(t.pus, (int)sysconf(_SC_NPROCESSORS_ONLN));
	int pus = 0;
	for (int i = 0; i < SL_MIN(t.nnodes, SL_TOPO_MAX_NODES); i++) {
		ck_assert_int_ge(t.node[i].os_index, 0);
		pus += t.node[i].pus;
	}
	if (t.nnodes <= SL_TOPO_MAX_NODES)
		ck_assert_int_eq(pus, t.pus); /* each PU is near exactly one node */
	ck_assert(t.node[0].memory_bytes > 0 || t.nnodes > 1);
	/* the last-level cache as sysfs says (glibc's sysconf said 320 MiB
	 * for a 32 MiB L3 on one VM) */
	const uint64_t l3 = sysfs_cache(3), llc = l3 ? l3 : sysfs_cache(2);
	if (llc)
		ck_assert_uint_eq(t.llc_bytes, llc);
	cpu_set_t cs;
	ck_assert_int_eq(t.binding_pus, affinity(&cs));
	ck_assert(t.binding[0]);

	/* the I/O node without a GPU is the one holding the process */
	ck_assert_int_eq(sl_topo_io_node(NULL), t.binding_node);
	ck_assert_int_eq(sl_topo_io_node(""), t.binding_node);
	if (t.nnodes == 1)
		ck_assert_int_eq(t.binding_node, t.node[0].os_index);

	/* binding to it is harmless and reads back */
	if (t.binding_node >= 0) {
		ck_assert_int_eq(sl_topo_bind_thread(t.binding_node, "test threads"), 0);
		ck_assert_int_eq(sl_topo_thread_node(), t.binding_node);
	}
	ck_assert_int_eq(sl_topo_bind_thread(-1, "test threads"), 0); /* no choice: nothing */

	/* devices that are not there */
	ck_assert_int_eq(sl_topo_pci_node("ffff:fe:1f.7"), -1);
	ck_assert_int_eq(sl_topo_pci_node("not a bus id"), -1);
	ck_assert_int_eq(sl_topo_pci_node(NULL), -1);

	/* memory binding: a no-op with one node, and never for node -1 */
	sl_topo_membind m;
	ck_assert(!sl_topo_membind_begin(-1, &m));
	if (t.nnodes == 1)
		ck_assert(!sl_topo_membind_begin(t.node[0].os_index, &m));
	else if (sl_topo_membind_begin(t.node[0].os_index, &m))
		sl_topo_membind_end(&m);
}
END_TEST

/* ---- the made-up two-node machine ----------------------------------------------- */

/* Why the two-node tests cannot run here, or NULL: they load the fixture
 * in each forked test process (one topology per process) and bind to PUs
 * 0 and 1. */
static const char *two_nodes_missing(void)
{
	const char *fork_mode = getenv("CK_FORK");
	if (fork_mode && !strcmp(fork_mode, "no"))
		return "needs Check's fork mode (one topology per process), CK_FORK=no is set";
	cpu_set_t cs;
	CPU_ZERO(&cs);
	if (sched_getaffinity(0, sizeof cs, &cs) != 0 || !CPU_ISSET(0, &cs) || !CPU_ISSET(1, &cs))
		return "needs PUs 0 and 1 in this process's affinity";
	return NULL;
}

/* Load the fixture in this (forked) test process (main checked that it
 * can: two_nodes_missing). */
static void fake_two_nodes(void)
{
	char path[600];
	snprintf(path, sizeof path, "%s/topology-2node.xml", fixtures);
	ck_assert_msg(access(path, R_OK) == 0, "fixture %s", path);
	setenv("HWLOC_XMLFILE", path, 1);
	setenv("HWLOC_THISSYSTEM", "1", 1);
	sl_topo_info t;
	ck_assert_msg(sl_topo_get(&t) == 0, "%s", sl_errmsg());
	ck_assert_int_eq(t.nnodes, 2);
}

START_TEST(test_fake_describe)
{
	fake_two_nodes();
	sl_topo_info t;
	ck_assert(sl_topo_get(&t) == 0);
	ck_assert_int_eq(t.packages, 2);
	ck_assert_int_eq(t.cores, 2);
	ck_assert_int_eq(t.pus, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(t.node[i].os_index, i);
		ck_assert_uint_eq(t.node[i].memory_bytes, (uint64_t)(i + 1) << 30);
		ck_assert_int_eq(t.node[i].cores, 1);
		ck_assert_int_eq(t.node[i].pus, 1);
		ck_assert_str_eq(t.node[i].cpus, i ? "1" : "0");
	}
	ck_assert_str_eq(t.binding, "0-1");
	ck_assert_int_eq(t.binding_node, -1); /* the process spans both nodes */
	ck_assert_uint_eq(t.llc_bytes, 0);    /* the description has no caches */

	/* the GPU hangs off package 1; the disk controller off the machine */
	ck_assert_int_eq(sl_topo_pci_node("0000:65:00.0"), 1);
	ck_assert_int_eq(sl_topo_pci_node("65:00.0"), 1); /* domain 0 implied */
	ck_assert_int_eq(sl_topo_pci_node("0000:00:02.0"), -1);
	ck_assert_int_eq(sl_topo_io_node("0000:65:00.0"), 1);
	ck_assert_int_eq(sl_topo_io_node(NULL), -1);          /* no single node holds us */
	ck_assert_int_eq(sl_topo_io_node("0000:00:02.0"), -1);
}
END_TEST

START_TEST(test_fake_bind)
{
	fake_two_nodes();
	cpu_set_t cs;
	ck_assert_int_eq(sl_topo_thread_node(), -1);
	ck_assert_msg(sl_topo_bind_thread(1, "test threads") == 0, "%s", sl_errmsg());
	ck_assert_int_eq(affinity(&cs), 1);
	ck_assert(CPU_ISSET(1, &cs));
	ck_assert_int_eq(sl_topo_thread_node(), 1);
	/* the I/O node follows the process as it started, not a thread bound
	 * since; and binding elsewhere stays possible */
	ck_assert_int_eq(sl_topo_io_node(NULL), -1);
	ck_assert_int_eq(sl_topo_bind_thread(0, "test threads"), 0);
	ck_assert_int_eq(affinity(&cs), 1);
	ck_assert(CPU_ISSET(0, &cs));
	ck_assert_int_eq(sl_topo_thread_node(), 0);

	/* a node that does not exist: an error and one warning, ever */
	fflush(stderr);
	char path[] = "/tmp/sl-topo-stderr-XXXXXX";
	int fd = mkstemp(path);
	ck_assert(fd >= 0);
	unlink(path);
	int saved = dup(2);
	dup2(fd, 2);
	int rc1 = sl_topo_bind_thread(7, "test threads");
	int rc2 = sl_topo_bind_thread(7, "test threads");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	char buf[1024] = "";
	ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
	buf[k > 0 ? k : 0] = 0;
	close(fd);
	ck_assert_int_lt(rc1, 0);
	ck_assert_int_lt(rc2, 0);
	ck_assert_msg(strstr(buf, "sluice: warning: cannot bind test threads to NUMA node 7 (no such node)") &&
			      strchr(buf, '\n') == buf + strlen(buf) - 1,
		      "one warning line, got: \"%s\"", buf);
	ck_assert_int_eq(sl_topo_thread_node(), 0); /* the binding is unchanged */

	/* memory binding to a node the kernel does not have may be refused:
	 * either way nothing breaks */
	sl_topo_membind m;
	if (sl_topo_membind_begin(1, &m))
		sl_topo_membind_end(&m);
}
END_TEST

/* A store's I/O threads on node 1, on both engines, the caller untouched. */
START_TEST(test_fake_store)
{
	fake_two_nodes();
	char dir[300];
	snprintf(dir, sizeof dir, "%s/store", tmp_root);
	ck_assert(mkdir(dir, 0755) == 0 || errno == EEXIST);
	for (int fallback = 0; fallback < 2; fallback++)
		for (int node = 1; node >= 0; node--) {
			sl_disk_params p = { .dir = dir, .file_name = "t.sluice", .key = "k", .data_bytes = 1 << 20,
					     .queue_depth = 4, .force_fallback = fallback, .bind_io = true,
					     .io_node = node };
			sl_disk_store *s;
			bool fresh;
			fflush(stderr);
			ck_assert_msg(sl_disk_open(&p, &s, &fresh) == 0, "%s", sl_errmsg());
			ck_assert_msg(sl_disk_io_node(s) == node, "%s threads on node %d, asked for %d",
				      sl_disk_mode(s), sl_disk_io_node(s), node);
			cpu_set_t cs;
			ck_assert_int_eq(affinity(&cs), 2); /* the caller is not bound */
			ck_assert_int_eq(sl_topo_thread_node(), -1);
			void *buf = NULL;
			ck_assert(posix_memalign(&buf, 4096, 1 << 20) == 0);
			memset(buf, node + 1, 1 << 20);
			uint64_t tk;
			ck_assert(sl_disk_write(s, 0, buf, 1 << 20, &tk) == 0 && sl_disk_wait(s, tk) == 0);
			ck_assert(sl_disk_read(s, 0, buf, 1 << 20, &tk) == 0 && sl_disk_wait(s, tk) == 0);
			ck_assert(((unsigned char *)buf)[12345] == node + 1);
			free(buf);
			sl_disk_close(s);
		}
	char f[400];
	snprintf(f, sizeof f, "%s/t.sluice", dir);
	unlink(f);
	rmdir(dir);
}
END_TEST

/* test_topology FIXTURES [here|two_nodes]: one group (meson runs each as
 * its own test), or both; a group that cannot run here exits 77 (SKIP)
 * with the reason on stderr. */
int main(int argc, char **argv)
{
	fixtures = argc > 1 ? argv[1] : "tests/fixtures";
	const char *group = argc > 2 ? argv[2] : NULL;
	const bool here = !group || !strcmp(group, "here");
	const bool two = !group || !strcmp(group, "two_nodes");
	if (!here && !two) {
		fprintf(stderr, "test_topology: unknown group '%s' (here, two_nodes)\n", group);
		return 1;
	}
	const char *missing = two ? two_nodes_missing() : NULL;
	if (missing && !here) {
		fprintf(stderr, "test_topology: SKIP two_nodes: %s\n", missing);
		return 77;
	}
	if (missing) {
		fprintf(stderr, "test_topology: two_nodes %s\n", missing);
		return 1;
	}
	snprintf(tmp_root, sizeof tmp_root, "/tmp/sl-topo-XXXXXX");
	if (!mkdtemp(tmp_root)) {
		fprintf(stderr, "test_topology: cannot create a directory under /tmp: %s\n", strerror(errno));
		return 1;
	}
	Suite *s = suite_create("topology");
	if (here) {
		TCase *tc = tcase_create("here");
		tcase_add_test(tc, test_here);
		suite_add_tcase(s, tc);
	}
	if (two) {
		TCase *tc = tcase_create("two_nodes");
		tcase_set_timeout(tc, 60);
		tcase_add_test(tc, test_fake_describe);
		tcase_add_test(tc, test_fake_bind);
		tcase_add_test(tc, test_fake_store);
		suite_add_tcase(s, tc);
	}
	int rc = sl_test_run(s);
	rmdir(tmp_root);
	return rc;
}
