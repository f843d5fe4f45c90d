/*
 * sl_le.h - little-endian integers in byte buffers (the on-disk headers and
 * tables: the disk store's header, the zstd frame table), whatever the
 * host's byte order.
 */
#ifndef SL_LE_H
#define SL_LE_H

#include <stdint.h>

static inline void sl_put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void sl_put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t sl_get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t sl_get_le64(const unsigned char *p)
{
	return (uint64_t)sl_get_le32(p) | (uint64_t)sl_get_le32(p + 4) << 32;
}

#endif
