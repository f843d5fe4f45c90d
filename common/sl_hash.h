/*
 * sl_hash.h - the two small non-cryptographic hashes sluice uses, one
 * implementation each.
 *
 * FNV-1a 64 (Fowler, Noll, Vo): identities that are written down and
 * compared later (a safetensors header's hash and a checkpoint's digest in
 * a weight store's key, a store's name tag) and the tokenizer's string
 * hash.  Chain it: sl_fnv1a64(sl_fnv1a64(SL_FNV1A64_INIT, a, n), b, m) is
 * the hash of a followed by b.
 *
 * splitmix64 (Vigna's finaliser, the output function of the SplitMix64
 * generator for state x + 0x9e3779b97f4a7c15): a bijective mixer of 64-bit
 * keys, the source of the sampler's draws and of --dummy weights.  The
 * SplitMix64 generator seeded with s outputs sl_splitmix64(s),
 * sl_splitmix64(s + 0x9e3779b97f4a7c15), ...
 *
 * Both feed values that must not change between versions (pinned in
 * tests/test_sampling.c, test_model.c and test_wstore.c).
 */
#ifndef SL_HASH_H
#define SL_HASH_H

#include <stddef.h>
#include <stdint.h>

#define SL_FNV1A64_INIT 0xcbf29ce484222325ull  /* the offset basis */
#define SL_FNV1A64_PRIME 0x100000001b3ull

/* h advanced over the n bytes at p (p may be NULL when n is 0). */
static inline uint64_t sl_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= SL_FNV1A64_PRIME;
	}
	return h;
}

static inline uint64_t sl_splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

#endif
