/*
 * backend.c - the backend registry and the accounting wrappers.  This is the
 * only file above the backends that knows whether CUDA was built.
 */
#include "backend.h"
#include "cpu/cpu_backend.h"
#include "sl_config.h"
#if SL_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <string.h>

bool sl_backend_cuda_built(void)
{
	return SL_HAVE_CUDA != 0;
}

#if SL_HAVE_CUDA
/* The CUDA backend keeps the thread count for the CPU work beside it. */
static int cuda_create(int nthreads, sl_backend **out)
{
	int rc = sl_cuda_backend_create(out);
	if (rc == 0)
		(*out)->nthreads = nthreads;
	return rc;
}
#endif

const char *sl_backend_resolve(const char *name)
{
	if (name && strcmp(name, "auto"))
		return name;
#if SL_HAVE_CUDA
	if (sl_cuda_usable())
		return "cuda";
#endif
	return "cpu";
}

int sl_backend_create(const char *name, int nthreads, sl_backend **out)
{
	*out = NULL;
	name = sl_backend_resolve(name); /* "auto": cuda where usable, else cpu */
	if (!strcmp(name, "cpu"))
		return sl_cpu_backend_create(nthreads, out);
	if (!strcmp(name, "cuda")) {
#if SL_HAVE_CUDA
		return cuda_create(nthreads, out);
#else
		return sl_err(SL_EUNSUPPORTED,
			      "backend 'cuda': this build has no CUDA support (rebuild with nvcc on PATH, meson -Dcuda=enabled)");
#endif
	}
	return sl_err(SL_EINVAL, "unknown backend '%s' (use cpu, cuda or auto)", name);
}

void sl_backend_free(sl_backend *b)
{
	if (b)
		b->ops->free(b);
}

int sl_backend_device_info(sl_backend *b, sl_device_info *out)
{
	memset(out, 0, sizeof *out);
	out->numa_node = -1;
	snprintf(out->name, sizeof out->name, "%s", b->ops->name);
	return b->ops->device_info ? b->ops->device_info(b, out) : 0;
}

int sl_backend_missing(sl_backend *b, const char *what)
{
	return sl_err(SL_EUNSUPPORTED, "backend '%s' has no %s", b->ops->name, what);
}

void sl_backend_set_dev_limit(sl_backend *b, size_t bytes)
{
	b->dev_limit = bytes;
}

int sl_attn_check_heads(const char *who, const sl_attn_args *a)
{
	if (a->nh <= 0 || a->nkv < 0 || (a->nkv > 0 && a->nh % a->nkv))
		return sl_err(SL_EINVAL,
			      "%s: %d query heads and %d KV heads: the KV heads must divide the query heads",
			      who, a->nh, a->nkv);
	return 0;
}

int sl_dev_account(sl_backend *b, size_t bytes, const char *what)
{
	if (b->dev_limit && b->dev_used + bytes > b->dev_limit) {
		b->host_refused = false;
		return sl_err(SL_EBUDGET,
			      "device memory budget exceeded allocating %s: %zu bytes needed, %zu of %zu in use",
			      what, bytes, b->dev_used, b->dev_limit);
	}
	b->dev_used += bytes;
	if (b->dev_used > b->dev_peak)
		b->dev_peak = b->dev_used;
	return 0;
}

void sl_dev_unaccount(sl_backend *b, size_t bytes)
{
	SL_ASSERT(bytes <= b->dev_used);
	b->dev_used -= bytes;
}

int sl_dev_alloc(sl_backend *b, size_t bytes, const char *what, void **out)
{
	*out = NULL;
	SL_TRY(sl_dev_account(b, bytes, what));
	int rc = b->ops->dev_alloc(b, bytes, out);
	if (rc < 0) {
		sl_dev_unaccount(b, bytes);
		return sl_err_prefix(rc, "allocating %zu bytes for %s", bytes, what);
	}
	b->data_used += bytes;
	if (b->data_used > b->data_peak)
		b->data_peak = b->data_used;
	return 0;
}

void sl_dev_free(sl_backend *b, void *p, size_t bytes)
{
	if (!p)
		return;
	b->ops->dev_free(b, p);
	sl_dev_unaccount(b, bytes);
	SL_ASSERT(bytes <= b->data_used);
	b->data_used -= bytes;
}

void sl_backend_set_host_limit(sl_backend *b, size_t bytes)
{
	b->host_limit = bytes;
}

int sl_host_alloc(sl_backend *b, size_t bytes, const char *what, void **out)
{
	*out = NULL;
	if (b->host_limit && b->host_used + bytes > b->host_limit) {
		b->host_refused = true;
		return sl_err(SL_EBUDGET,
			      "host memory budget exceeded allocating %s: %zu bytes needed, %zu of %zu in use",
			      what, bytes, b->host_used, b->host_limit);
	}
	int rc = b->ops->host_alloc(b, bytes, out);
	if (rc < 0)
		return sl_err_prefix(rc, "allocating %zu bytes of pinned memory for %s", bytes, what);
	b->host_used += bytes;
	if (b->host_used > b->host_peak)
		b->host_peak = b->host_used;
	return 0;
}

void sl_host_free(sl_backend *b, void *p, size_t bytes)
{
	if (!p)
		return;
	b->ops->host_free(b, p);
	SL_ASSERT(bytes <= b->host_used);
	b->host_used -= bytes;
}

int sl_buf_alloc(sl_backend *b, int tier, size_t bytes, const char *what, sl_buf *out)
{
	*out = (sl_buf){ 0 };
	int rc;
	if (tier == SL_MEM_DEVICE)
		rc = sl_dev_alloc(b, bytes, what, &out->p);
	else if (tier == SL_MEM_HOST)
		rc = sl_host_alloc(b, bytes, what, &out->p);
	else
		return sl_err(SL_EINVAL, "allocating %s: no memory tier %d", what, tier);
	if (rc < 0) {
		out->p = NULL;
		return rc;
	}
	out->bytes = bytes;
	out->tier = (unsigned char)tier;
	return 0;
}

void sl_buf_free(sl_backend *b, sl_buf *buf)
{
	if (buf->tier == SL_MEM_DEVICE)
		sl_dev_free(b, buf->p, buf->bytes);
	else if (buf->tier == SL_MEM_HOST)
		sl_host_free(b, buf->p, buf->bytes);
	*buf = (sl_buf){ 0 };
}
