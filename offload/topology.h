/*
 * topology.h - the machine as hwloc sees it, and placing threads and memory
 * on it: NUMA nodes (local memory, cores and PUs each), packages, the NUMA
 * node nearest a PCI device (the GPU, by its bus id), the process's CPU
 * binding; binding a thread to a node's cores, and a thread's memory policy
 * to a node for pinned allocations.
 *
 * Nodes are named by the kernel's number (hwloc's OS index, numactl's), so
 * "node 1" means the same here as in `numactl -H`.
 *
 * One topology, PCI devices included, is loaded per process on first use
 * (about 50 ms) and shared; hwloc's queries and binding calls on it are
 * thread-safe.  hwloc's environment variables apply when it loads (tests
 * fake a two-node machine with HWLOC_XMLFILE or HWLOC_SYNTHETIC and
 * HWLOC_THISSYSTEM=1).
 *
 * Placement never stops a run: with one NUMA node binding is a no-op, and
 * where hwloc or the kernel refuses, one warning line is printed (once per
 * process) and work goes on where the scheduler puts it.
 *
 * This module sits below kernels/ (the CUDA backend places its pinned
 * buffers with it) and needs only hwloc and common/.
 */
#ifndef SL_TOPOLOGY_H
#define SL_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SL_TOPO_MAX_NODES 64 /* nodes listed in sl_topo_info (more are counted) */

typedef struct sl_topo_node {
	int os_index;          /* the kernel's node number */
	uint64_t memory_bytes; /* memory local to the node */
	int cores, pus;        /* cores and hardware threads nearest it */
	char cpus[64];         /* its PUs as a list, e.g. "0-15,32-47" */
} sl_topo_node;

typedef struct sl_topo_info {
	bool loaded;   /* false: hwloc failed; one node and sysconf's counts */
	int packages;  /* 0 where hwloc cannot tell */
	int cores, pus;
	int nnodes;    /* NUMA nodes, at least 1 */
	sl_topo_node node[SL_TOPO_MAX_NODES]; /* the first min(nnodes, 64) */
	char binding[128]; /* the process's CPU binding as a list, e.g. "0-15" */
	int binding_pus;   /* PUs in it */
	int binding_node;  /* the node whose cores hold all of it; -1: several */
	uint64_t llc_bytes; /* the first last-level cache's size (hwloc's L3, else
			       L2, as Linux's sysfs says; glibc's sysconf, read
			       from cpuid, can be 10x off in a VM); 0: unknown */
} sl_topo_info;

/* Describe the machine.  Always fills *out; returns 0, or SL_EDEVICE (with
 * a message) where hwloc could not load and *out is the fallback guess. */
int sl_topo_get(sl_topo_info *out);

/*
 * The NUMA node nearest a PCI device given its bus id ("0000:65:00.0", as
 * cudaDeviceGetPCIBusId writes it, any case): the lowest-numbered node
 * local to the device's non-I/O ancestor.  -1 where the device is not
 * found, hwloc cannot tell, or the device hangs off the whole machine of
 * several nodes (no node is nearer).
 */
int sl_topo_pci_node(const char *busid);

/*
 * The node for I/O threads and staging memory: the GPU's (gpu_busid, may
 * be NULL or empty), else the node holding the whole process binding (as
 * it was when the topology loaded), else -1 (leave threads where they
 * are).  On a one-node machine: that node.
 */
int sl_topo_io_node(const char *gpu_busid);

/*
 * Bind the calling thread to the cores of NUMA node `node`, within the
 * process's binding as it was when the topology loaded (a process
 * restricted with taskset stays inside it; threads bound here earlier do
 * not narrow it).
 * 0 on success, and where there is nothing to do (one NUMA node, or node
 * < 0); a negative SL_E* code where binding failed, after the one-time
 * warning "sluice: warning: cannot bind <what> to NUMA node N (...); they
 * run where the scheduler puts them".  `what` names the threads ("I/O
 * threads").
 */
int sl_topo_bind_thread(int node, const char *what);

/* The node whose cores hold the calling thread's whole CPU binding; -1
 * where it spans several nodes or hwloc cannot tell. */
int sl_topo_thread_node(void);

/*
 * Pinned memory near a node: between begin and end, pages the calling
 * thread faults in come from `node` (a thread memory policy, as
 * cudaHostAlloc pins under it).  begin returns false and changes nothing
 * with one NUMA node, node < 0, or where hwloc refuses; call end only after
 * a true begin.
 */
typedef struct sl_topo_membind {
	void *saved; /* the thread's previous nodeset (hwloc_nodeset_t) */
	int policy;  /* and policy */
} sl_topo_membind;

bool sl_topo_membind_begin(int node, sl_topo_membind *m);
void sl_topo_membind_end(sl_topo_membind *m);

#ifdef __cplusplus
}
#endif

#endif
