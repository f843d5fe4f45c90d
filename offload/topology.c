/*
 * topology.c - hwloc topology, thread and memory binding (topology.h).
 */
#include "topology.h"
#include "sl_common.h"

#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* ---- the process's topology ------------------------------------------------ */

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static hwloc_topology_t topo;    /* NULL where hwloc failed */
static char topo_why[160];        /* and why */
static hwloc_bitmap_t start_binding; /* the process's CPU binding at load */
static atomic_bool bind_warned;

static void topo_load(void)
{
	hwloc_topology_t t;
	if (hwloc_topology_init(&t) < 0) {
		snprintf(topo_why, sizeof topo_why, "hwloc_topology_init: %s", strerror(errno));
		return;
	}
	/* PCI devices too (GPUs, NVMe), without bridges and the rest */
	hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if HWLOC_API_VERSION >= 0x00020100
	/* not OpenCL's devices: sluice finds the GPU by its PCI bus id, and the
	 * plugin loads and initialises every OpenCL driver installed (whose
	 * dynamically loaded thread-local storage also crashes LeakSanitizer's
	 * scan at exit with GCC 12 on glibc 2.36) */
	hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
#endif
	if (hwloc_topology_load(t) < 0) {
		snprintf(topo_why, sizeof topo_why, "hwloc_topology_load: %s", strerror(errno));
		hwloc_topology_destroy(t);
		return;
	}
	topo = t; /* kept for the life of the process */
	start_binding = hwloc_bitmap_alloc();
	if (start_binding && (hwloc_get_cpubind(t, start_binding, HWLOC_CPUBIND_PROCESS) < 0 ||
			      hwloc_bitmap_iszero(start_binding)))
		hwloc_bitmap_copy(start_binding, hwloc_topology_get_allowed_cpuset(t));
}

static hwloc_topology_t topo_get(void)
{
	pthread_once(&topo_once, topo_load);
	return topo;
}

static int topo_nnodes(hwloc_topology_t t)
{
	int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
	return n > 0 ? n : 1;
}

/* The first node (by number) whose cores hold all of set; -1 if none. */
static int node_holding(hwloc_topology_t t, hwloc_const_cpuset_t set)
{
	if (hwloc_bitmap_iszero(set))
		return -1;
	int best = -1;
	hwloc_obj_t n = NULL;
	while ((n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) != NULL)
		if (n->cpuset && !hwloc_bitmap_iszero(n->cpuset) && hwloc_bitmap_isincluded(set, n->cpuset) &&
		    (best < 0 || (int)n->os_index < best))
			best = (int)n->os_index;
	if (best < 0 && topo_nnodes(t) == 1)
		best = 0; /* one node (or none reported): everything is on it */
	return best;
}

/* The process's CPU binding now (start: as it was when the topology
 * loaded, before any thread bound itself here); the allowed set where hwloc
 * cannot tell.  The caller frees it. */
static hwloc_bitmap_t process_binding(hwloc_topology_t t, bool start)
{
	if (start && start_binding)
		return hwloc_bitmap_dup(start_binding);
	hwloc_bitmap_t s = hwloc_bitmap_alloc();
	if (!s)
		return NULL;
	if (hwloc_get_cpubind(t, s, HWLOC_CPUBIND_PROCESS) < 0 || hwloc_bitmap_iszero(s))
		hwloc_bitmap_copy(s, hwloc_topology_get_allowed_cpuset(t));
	return s;
}

/* ---- description ------------------------------------------------------------- */

/* glibc's guess at the last-level cache (from cpuid: a VM's can be 10x
 * off), where hwloc cannot say; 0: unknown. */
static uint64_t sysconf_llc(void)
{
	long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
	if (llc <= 0)
		llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
	return llc > 0 ? (uint64_t)llc : 0;
}

static void fallback_info(sl_topo_info *out)
{
	long pus = sysconf(_SC_NPROCESSORS_ONLN);
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	out->pus = out->cores = pus > 0 ? (int)pus : 1;
	out->nnodes = 1;
	out->node[0].os_index = 0;
	out->node[0].memory_bytes = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
	out->node[0].cores = out->node[0].pus = out->pus;
	snprintf(out->node[0].cpus, sizeof out->node[0].cpus, "0-%d", out->pus - 1);
	out->llc_bytes = sysconf_llc();
	cpu_set_t cs;
	CPU_ZERO(&cs);
	if (sched_getaffinity(0, sizeof cs, &cs) == 0) {
		/* a list like hwloc's: runs of set bits */
		size_t len = 0;
		out->binding_pus = CPU_COUNT(&cs);
		for (int i = 0; i < CPU_SETSIZE && len < sizeof out->binding - 24; i++) {
			if (!CPU_ISSET(i, &cs))
				continue;
			int j = i;
			while (j + 1 < CPU_SETSIZE && CPU_ISSET(j + 1, &cs))
				j++;
			len += (size_t)snprintf(out->binding + len, sizeof out->binding - len,
						j > i ? "%s%d-%d" : "%s%d", len ? "," : "", i, j);
			i = j;
		}
	}
	out->binding_node = 0;
}

int sl_topo_get(sl_topo_info *out)
{
	memset(out, 0, sizeof *out);
	hwloc_topology_t t = topo_get();
	if (!t) {
		fallback_info(out);
		return sl_err(SL_EDEVICE, "hwloc could not describe this machine (%s)", topo_why);
	}
	out->loaded = true;
	out->packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
	out->pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
	out->cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
	if (out->cores <= 0)
		out->cores = out->pus; /* no core level reported (some VMs) */
	out->nnodes = topo_nnodes(t);
	hwloc_obj_t cache = hwloc_get_obj_by_type(t, HWLOC_OBJ_L3CACHE, 0);
	if (!cache)
		cache = hwloc_get_obj_by_type(t, HWLOC_OBJ_L2CACHE, 0);
	out->llc_bytes = cache && cache->attr ? cache->attr->cache.size : 0;
	if (!out->llc_bytes && !getenv("HWLOC_XMLFILE")) /* this machine, its caches hidden */
		out->llc_bytes = sysconf_llc();
	int i = 0;
	hwloc_obj_t n = NULL;
	while ((n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) != NULL && i < SL_TOPO_MAX_NODES) {
		sl_topo_node *d = &out->node[i++];
		d->os_index = (int)n->os_index;
		d->memory_bytes = n->attr ? n->attr->numanode.local_memory : 0;
		if (n->cpuset) {
			d->pus = hwloc_get_nbobjs_inside_cpuset_by_type(t, n->cpuset, HWLOC_OBJ_PU);
			d->cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, n->cpuset, HWLOC_OBJ_CORE);
			if (d->cores <= 0)
				d->cores = d->pus;
			hwloc_bitmap_list_snprintf(d->cpus, sizeof d->cpus, n->cpuset);
		}
	}
	if (i == 0) { /* no NUMA object at all: the machine is the node */
		out->node[0].memory_bytes = hwloc_get_root_obj(t)->total_memory;
		out->node[0].cores = out->cores;
		out->node[0].pus = out->pus;
		hwloc_bitmap_list_snprintf(out->node[0].cpus, sizeof out->node[0].cpus,
					   hwloc_topology_get_topology_cpuset(t));
	}
	hwloc_bitmap_t b = process_binding(t, false);
	if (b) {
		hwloc_bitmap_list_snprintf(out->binding, sizeof out->binding, b);
		out->binding_pus = hwloc_bitmap_weight(b);
		out->binding_node = node_holding(t, b);
		hwloc_bitmap_free(b);
	} else {
		out->binding_node = -1;
	}
	return 0;
}

int sl_topo_pci_node(const char *busid)
{
	hwloc_topology_t t = topo_get();
	if (!t || !busid || !busid[0])
		return -1;
	hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(t, busid);
	if (!pci)
		return -1;
	hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, pci);
	if (!anc || !anc->nodeset || hwloc_bitmap_iszero(anc->nodeset))
		return -1;
	/* attached to the whole machine (of several nodes): no node is nearer */
	if (topo_nnodes(t) > 1 &&
	    hwloc_bitmap_isincluded(hwloc_topology_get_topology_nodeset(t), anc->nodeset))
		return -1;
	return hwloc_bitmap_first(anc->nodeset);
}

int sl_topo_io_node(const char *gpu_busid)
{
	int node = sl_topo_pci_node(gpu_busid);
	if (node >= 0)
		return node;
	hwloc_topology_t t = topo_get();
	if (!t)
		return -1;
	hwloc_bitmap_t b = process_binding(t, true);
	if (!b)
		return -1;
	node = node_holding(t, b);
	hwloc_bitmap_free(b);
	return node;
}

/* ---- binding ------------------------------------------------------------------ */

static int bind_fail(int node, const char *what, const char *why)
{
	if (!atomic_exchange(&bind_warned, true))
		fprintf(stderr, "sluice: warning: cannot bind %s to NUMA node %d (%s); they run where the scheduler puts them\n",
			what ? what : "threads", node, why);
	return sl_err(SL_EDEVICE, "cannot bind %s to NUMA node %d (%s)", what ? what : "threads", node, why);
}

int sl_topo_bind_thread(int node, const char *what)
{
	if (node < 0)
		return 0;
	hwloc_topology_t t = topo_get();
	if (!t)
		return bind_fail(node, what, topo_why);
	if (topo_nnodes(t) <= 1)
		return 0;
	hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(t, (unsigned)node);
	if (!n)
		return bind_fail(node, what, "no such node");
	if (!n->cpuset || hwloc_bitmap_iszero(n->cpuset))
		return bind_fail(node, what, "the node has no cores");
	hwloc_bitmap_t set = process_binding(t, true);
	if (!set)
		return bind_fail(node, what, "out of memory");
	hwloc_bitmap_and(set, set, n->cpuset);
	int rc = 0;
	if (hwloc_bitmap_iszero(set))
		rc = bind_fail(node, what, "its cores are outside this process's CPU binding");
	else if (hwloc_set_cpubind(t, set, HWLOC_CPUBIND_THREAD) < 0) {
		char why[96];
		snprintf(why, sizeof why, "hwloc_set_cpubind: %s", strerror(errno));
		rc = bind_fail(node, what, why);
	}
	hwloc_bitmap_free(set);
	return rc;
}

int sl_topo_thread_node(void)
{
	hwloc_topology_t t = topo_get();
	if (!t)
		return -1;
	hwloc_bitmap_t s = hwloc_bitmap_alloc();
	if (!s)
		return -1;
	int node = -1;
	if (hwloc_get_cpubind(t, s, HWLOC_CPUBIND_THREAD) == 0)
		node = node_holding(t, s);
	hwloc_bitmap_free(s);
	return node;
}

bool sl_topo_membind_begin(int node, sl_topo_membind *m)
{
	m->saved = NULL;
	m->policy = HWLOC_MEMBIND_DEFAULT;
	hwloc_topology_t t = node >= 0 ? topo_get() : NULL;
	if (!t || topo_nnodes(t) <= 1)
		return false; /* one memory node: nothing to choose */
	hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(t, (unsigned)node);
	hwloc_nodeset_t saved = n ? hwloc_bitmap_alloc() : NULL;
	hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
	if (!saved)
		return false;
	if (hwloc_get_membind(t, saved, &policy, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) < 0 ||
	    hwloc_set_membind(t, n->nodeset, HWLOC_MEMBIND_BIND,
			      HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) < 0) {
		hwloc_bitmap_free(saved);
		return false;
	}
	m->saved = saved;
	m->policy = (int)policy;
	return true;
}

void sl_topo_membind_end(sl_topo_membind *m)
{
	hwloc_topology_t t = topo_get();
	if (!m->saved || !t)
		return;
	hwloc_set_membind(t, (hwloc_nodeset_t)m->saved, (hwloc_membind_policy_t)m->policy,
			  HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
	hwloc_bitmap_free((hwloc_nodeset_t)m->saved);
	m->saved = NULL;
}
