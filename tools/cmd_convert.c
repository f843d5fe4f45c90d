/*
 * cmd_convert.c - `sluice convert`: the weights' disk stores of an offload
 * folder.  Writes a model's store for a placement ahead of a job (the job
 * then reuses it), lists the folder's stores and whether each still
 * matches its checkpoint, and removes the stale ones.
 */
#include "backend.h"
#include "cli.h"
#include "policy.h"
#include "wstore.h"

#include <getopt.h>
#include <omp.h>
#include <string.h>

static const char convert_help[] =
	"usage: sluice convert (--model DIR | --dummy NAME) --offload-dir DIR\n"
	"                      (--percent WG WC CG CC AG AC | --policy FILE) [--compress-weight]\n"
	"                      [--zstd[=LEVEL]] [--cpu-mem BYTES] [--threads N]\n"
	"       sluice convert --offload-dir DIR --list\n"
	"       sluice convert --offload-dir DIR --clean\n"
	"The disk share of a model's weights is kept in the offload folder, one store per\n"
	"checkpoint, placement and dtype (DIR/<model>.<source>.w<WG>-<WC>[.q4].weights.sluice),\n"
	"and reused by every job while the checkpoint's weight files are unchanged.\n"
	"  (default)            write the store a job with this model and placement would\n"
	"                       write, and nothing else (the weights' percentages matter)\n"
	"  --compress-weight    the 4-bit store a job with --compress-weight reads (the\n"
	"                       layers' matrices quantised; also compress_weight in --policy)\n"
	"  --zstd[=LEVEL]       store the disk share as zstd frames (fp16 byte-shuffled, of at\n"
	"                       most 4 MiB each; LEVEL 1 to 19, default 1): DIR/<...>.zst.weights.sluice,\n"
	"                       which every job with this model and placement then reads in place\n"
	"                       of the plain store, decompressing on its threads\n"
	"  --list               each store in DIR: current, stale (its checkpoint changed\n"
	"                       or is gone), incomplete (interrupted) or foreign (another\n"
	"                       version's), with its size and what it holds\n"
	"  --clean              remove every store that is not current, except those a\n"
	"                       running job holds open\n"
	"  --model DIR, --dummy NAME, --offload-dir DIR, --percent, --policy, --cpu-mem,\n"
	"  --threads            as for sluice generate\n";

static void usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "sluice convert: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see 'sluice convert --help')\n");
	exit(EXIT_USAGE);
}

static void fail(int rc)
{
	fprintf(stderr, "sluice: %s\n", sl_errmsg());
	exit(rc == SL_EINVAL ? EXIT_USAGE : EXIT_FAILURE);
}

static void fmt_size(uint64_t n, char *buf, size_t len)
{
	if (n >= (1ull << 30))
		snprintf(buf, len, "%.1f GiB", n / 1073741824.0);
	else if (n >= (1ull << 20))
		snprintf(buf, len, "%.1f MiB", n / 1048576.0);
	else
		snprintf(buf, len, "%.1f KiB", n / 1024.0);
}

/* --list and --clean. */
static int list_or_clean(const char *dir, bool clean)
{
	sl_wstore_entry *v = NULL;
	int n = 0, rc = sl_wstore_list(dir, &v, &n);
	if (rc < 0)
		fail(rc);
	uint64_t total = 0, freed = 0;
	int stale = 0, removed = 0, kept = 0;
	for (int i = 0; i < n; i++) {
		const sl_wstore_entry *e = &v[i];
		char size[32], path[4400];
		fmt_size(e->bytes, size, sizeof size);
		snprintf(path, sizeof path, "%s/%s", dir, e->name);
		total += e->bytes;
		const bool current = e->state == SL_WSTORE_CURRENT;
		stale += !current;
		if (!clean) {
			printf("%-10s %10s  %s%s%s%s%s%s\n", sl_wstore_state_name(e->state), size, e->name,
			       e->what[0] ? "  " : "", e->what, e->why[0] ? ": " : "", e->why,
			       e->in_use ? " (in use)" : "");
			continue;
		}
		if (current)
			continue;
		if (!e->ours) {
			printf("kept %s: %s (not a sluice store)\n", path, e->why);
			kept++;
			continue;
		}
		bool gone = false;
		if ((rc = sl_disk_remove_unused(path, &gone)) < 0)
			fail(rc);
		if (gone) {
			printf("removed %s (%s, %s: %s)\n", path, size, sl_wstore_state_name(e->state), e->why);
			removed++;
			freed += e->bytes;
		} else {
			printf("kept %s: in use by a running job\n", path);
			kept++;
		}
	}
	char t[32];
	if (!clean) {
		fmt_size(total, t, sizeof t);
		if (n == 0)
			printf("no weight stores in %s\n", dir);
		else
			printf("%d store%s, %s; %d not current%s\n", n, n == 1 ? "" : "s", t, stale,
			       stale ? " (sluice convert --clean removes them)" : "");
	} else {
		fmt_size(freed, t, sizeof t);
		printf("removed %d store%s (%s)%s\n", removed, removed == 1 ? "" : "s", t,
		       kept ? "; see above for the ones kept" : "");
	}
	free(v);
	return 0;
}

int cmd_convert(int argc, char **argv)
{
	enum { C_MODEL = 1, C_DUMMY, C_OFFLOAD, C_PERCENT, C_POLICY, C_CPU_MEM, C_THREADS, C_LIST, C_CLEAN,
	       C_COMPRESS, C_ZSTD };
	static const struct option opts[] = {
		{ "model", required_argument, 0, C_MODEL },	{ "dummy", required_argument, 0, C_DUMMY },
		{ "offload-dir", required_argument, 0, C_OFFLOAD }, { "percent", required_argument, 0, C_PERCENT },
		{ "policy", required_argument, 0, C_POLICY },	{ "cpu-mem", required_argument, 0, C_CPU_MEM },
		{ "threads", required_argument, 0, C_THREADS }, { "list", no_argument, 0, C_LIST },
		{ "clean", no_argument, 0, C_CLEAN },		{ "help", no_argument, 0, 'h' },
		{ "compress-weight", no_argument, 0, C_COMPRESS },
		{ "zstd", optional_argument, 0, C_ZSTD },
		{ 0, 0, 0, 0 },
	};
	const char *model = NULL, *dummy = NULL, *dir = NULL;
	bool list = false, clean = false, placed = false, compress = false;
	size_t cpu_mem = 0;
	int threads = 0, zstd = 0;
	sl_policy pol;
	sl_policy_default(&pol);
	int c;
	opterr = 0; /* one line of ours instead of getopt's */
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case C_MODEL: model = optarg; break;
		case C_DUMMY: dummy = optarg; break;
		case C_OFFLOAD: dir = optarg; break;
		case C_PERCENT: {
			const char *v[6] = { optarg };
			for (int i = 1; i < 6; i++) {
				if (optind >= argc)
					usage("%s", "--percent takes six numbers: WG WC CG CC AG AC");
				v[i] = argv[optind++];
			}
			if (sl_policy_set_percent(&pol, v) < 0)
				usage("%s", sl_errmsg());
			placed = true;
			break;
		}
		case C_POLICY:
			if (sl_policy_load(optarg, &pol) < 0)
				fail(SL_EFORMAT);
			placed = true;
			break;
		case C_CPU_MEM:
			if (sl_parse_size(optarg, &cpu_mem) < 0)
				usage("--cpu-mem: %s", sl_errmsg());
			break;
		case C_THREADS: {
			char *end;
			long t = strtol(optarg, &end, 10);
			if (!*optarg || *end || t < 1 || t > 4096)
				usage("--threads must be an integer in [1, 4096], got '%s'", optarg);
			threads = (int)t;
			break;
		}
		case C_LIST: list = true; break;
		case C_COMPRESS: compress = true; break;
		case C_ZSTD: {
			char *end;
			long z = optarg ? strtol(optarg, &end, 10) : 1;
			if (optarg && (!*optarg || *end || z < 1 || z > 19))
				usage("--zstd=LEVEL takes a level from 1 to 19, got '%s'", optarg);
			zstd = (int)z;
			break;
		}
		case C_CLEAN: clean = true; break;
		case 'h': fputs(convert_help, stdout); return 0;
		case ':': usage("%s needs a value", argv[optind - 1]); break;
		default: usage("unknown option '%s'", argv[optind - 1]); break;
		}
	}
	if (optind < argc)
		usage("unexpected argument '%s'", argv[optind]);
	if (!dir)
		usage("%s", "--offload-dir DIR is required");
	if (list || clean) {
		if (list && clean)
			usage("%s", "give one of --list and --clean");
		if (model || dummy || placed || compress || zstd)
			usage("%s", "--list and --clean take only --offload-dir");
		return list_or_clean(dir, clean);
	}
	if (!!model == !!dummy)
		usage("%s", "give exactly one of --model DIR and --dummy NAME (or --list, --clean)");
	if (!placed)
		usage("%s", "give the placement: --percent WG WC CG CC AG AC or --policy FILE");
	int rc = sl_policy_validate(&pol, "policy");
	if (rc < 0)
		usage("%s", sl_errmsg());
	if (threads > 0)
		omp_set_num_threads(threads);
	sl_backend *be = NULL;
	if ((rc = sl_backend_create("cpu", threads, &be)) < 0)
		fail(rc);
	sl_backend_set_host_limit(be, cpu_mem);
	char path[4400];
	bool written = false;
	const double t0 = sl_now();
	rc = sl_wstore_convert(be, model, dummy, pol.w_gpu_percent, pol.w_cpu_percent,
			       compress || pol.compress_weight, zstd, dir, path, sizeof path, &written);
	sl_backend_free(be);
	if (rc < 0)
		fail(rc);
	if (written)
		printf("wrote %s in %.1f s\n", path, sl_now() - t0);
	else
		printf("%s is current already\n", path);
	return 0;
}
