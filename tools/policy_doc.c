/*
 * policy_doc.c - write docs/policy.md (the policy file format) from the
 * field table in policy/policy.c.
 *
 *   policy_doc              Markdown to stdout
 *   policy_doc FILE         write FILE (e.g. docs/policy.md)
 */
#include "policy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
		fprintf(argc > 2 ? stderr : stdout, "usage: %s [OUT.md]\n", argv[0]);
		return argc > 2 ? 2 : 0;
	}
	if (argc == 1) {
		sl_policy_doc_markdown(stdout);
		return fflush(stdout) ? 1 : 0;
	}
	FILE *f = fopen(argv[1], "w");
	if (!f) {
		fprintf(stderr, "policy_doc: cannot write %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	sl_policy_doc_markdown(f);
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, "policy_doc: cannot write %s\n", argv[1]);
		return 1;
	}
	return 0;
}
