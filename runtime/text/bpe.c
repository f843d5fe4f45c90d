/*
 * bpe.c - byte-pair encoding of one pre-token: its bytes (byte-level) or
 * its characters (SentencePiece-style, with byte fallback and unk) become
 * the ids of its symbols, then the adjacent pair of lowest merge rank is
 * merged, leftmost first on a tie, until no pair has a merge; the order of
 * HF's Word::merge_all.  Short words merge over a compact array, long ones
 * over a heap of candidate pairs; both give the same ids.
 */
#include "text_internal.h"

#include <string.h>

int sl_tok_grow(void **a, size_t *cap, size_t n, size_t sz)
{
	if (n <= *cap)
		return 0;
	size_t nc = SL_MAX(n, 2 * *cap);
	void *na = realloc(*a, nc * sz);
	if (!na)
		return sl_err(SL_ENOMEM, "tokenizer: out of memory");
	*a = na;
	*cap = nc;
	return 0;
}

int sl_tok_push_id(struct sl_tok_work *w, int32_t id)
{
	if (w->n == w->cap) {
		size_t nc = w->cap * 2;
		int32_t *ni = realloc(w->ids, nc * sizeof *ni);
		if (!ni)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		w->ids = ni;
		w->cap = nc;
	}
	w->ids[w->n++] = id;
	return 0;
}

static inline bool sl_tok_cand_less(struct sl_tok_cand a, struct sl_tok_cand b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void sl_tok_heap_push(struct sl_tok_cand *h, size_t *n, struct sl_tok_cand c)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (!sl_tok_cand_less(c, h[up]))
			break;
		h[i] = h[up];
		i = up;
	}
	h[i] = c;
}

static struct sl_tok_cand sl_tok_heap_pop(struct sl_tok_cand *h, size_t *n)
{
	struct sl_tok_cand top = h[0], last = h[--(*n)];
	size_t i = 0, cnt = *n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= cnt)
			break;
		if (c + 1 < cnt && sl_tok_cand_less(h[c + 1], h[c]))
			c++;
		if (!sl_tok_cand_less(h[c], last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (cnt > 0)
		h[i] = last;
	return top;
}

/*
 * BPE of a short word: repeatedly merge the adjacent pair of lowest rank,
 * the leftmost on a tie, over a compact array.  That is the order HF's
 * heap (below) merges in, at O(m^2) cost that beats a heap for small m.
 */
#define SL_TOK_SMALL_WORD 24

static int sl_tok_bpe_small(const sl_tokenizer *t, struct sl_tok_work *w,
			    const int32_t *init, int k)
{
	int32_t id[SL_TOK_SMALL_WORD], rank[SL_TOK_SMALL_WORD], to[SL_TOK_SMALL_WORD];
	memcpy(id, init, (size_t)k * sizeof *id);
	/* rank[i], to[i]: the merge of id[i] and id[i + 1], INT32_MAX if none */
	for (int i = 0; i + 1 < k; i++) {
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, id[i], id[i + 1]);
		rank[i] = mg ? mg->rank : INT32_MAX;
		to[i] = mg ? mg->id : -1;
	}
	while (k > 1) {
		int best = 0;
		for (int i = 1; i + 1 < k; i++)
			if (rank[i] < rank[best])
				best = i;
		if (rank[best] == INT32_MAX)
			break;
		id[best] = to[best];
		for (int i = best + 1; i + 1 < k; i++) {
			id[i] = id[i + 1];
			rank[i] = rank[i + 1];
			to[i] = to[i + 1];
		}
		k--;
		for (int i = best - 1; i <= best; i++) {
			if (i < 0 || i + 1 >= k)
				continue;
			const struct sl_tok_merge *mg = sl_tok_merge_find(t, id[i], id[i + 1]);
			rank[i] = mg ? mg->rank : INT32_MAX;
			to[i] = mg ? mg->id : -1;
		}
	}
	for (int i = 0; i < k; i++)
		SL_TRY(sl_tok_push_id(w, id[i]));
	return 0;
}

/*
 * BPE of a long word, the way HF's Word::merge_all does: a min-heap of
 * candidate pairs ordered by (rank, left position); a popped candidate is
 * stale unless the pair now at its position still has that rank.
 */
static int sl_tok_bpe_heap(const sl_tokenizer *t, struct sl_tok_work *w, const int32_t *init,
			   int32_t k)
{
	if (w->word_cap < (size_t)k) {
		size_t nc = SL_MAX((size_t)k, 2 * w->word_cap);
		struct sl_tok_sym *ns = realloc(w->sym, nc * sizeof *ns);
		if (ns)
			w->sym = ns;
		struct sl_tok_cand *nh = realloc(w->heap, 3 * nc * sizeof *nh);
		if (nh)
			w->heap = nh;
		if (!ns || !nh)
			return sl_err(SL_ENOMEM, "tokenizer: out of memory");
		w->word_cap = nc;
	}
	struct sl_tok_sym *s = w->sym;
	struct sl_tok_cand *h = w->heap;
	for (int32_t i = 0; i < k; i++) {
		s[i].id = init[i];
		s[i].prev = i - 1;
		s[i].next = i + 1;
	}
	s[k - 1].next = -1;
	size_t hn = 0;
	for (int32_t i = 0; i + 1 < k; i++) {
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, s[i].id, s[i + 1].id);
		if (mg)
			sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, i });
	}
	while (hn > 0) {
		struct sl_tok_cand c = sl_tok_heap_pop(h, &hn);
		struct sl_tok_sym *a = &s[c.pos];
		if (a->id < 0 || a->next < 0)
			continue;
		int32_t nx = a->next;
		const struct sl_tok_merge *mg = sl_tok_merge_find(t, a->id, s[nx].id);
		if (!mg || mg->rank != c.rank)
			continue;
		a->id = mg->id;
		a->next = s[nx].next;
		if (a->next >= 0)
			s[a->next].prev = c.pos;
		s[nx].id = -1;
		if (a->prev >= 0) {
			mg = sl_tok_merge_find(t, s[a->prev].id, a->id);
			if (mg)
				sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, a->prev });
		}
		if (a->next >= 0) {
			mg = sl_tok_merge_find(t, a->id, s[a->next].id);
			if (mg)
				sl_tok_heap_push(h, &hn, (struct sl_tok_cand){ mg->rank, c.pos });
		}
	}
	for (int32_t i = 0; i >= 0; i = s[i].next)
		SL_TRY(sl_tok_push_id(w, s[i].id));
	return 0;
}

/* HF's BPE::merge_word start: each char's id; else with byte fallback its
 * bytes' "<0xNN>" ids when all exist; else unk (a run of unks fused into
 * one with fuse_unk); else nothing. */
static int32_t sl_tok_chars(const sl_tokenizer *t, const uint8_t *p, size_t m, int32_t *init)
{
	int32_t k = 0;
	bool prev_unk = false;
	for (size_t i = 0; i < m;) {
		uint32_t cp;
		int need, l = sl_utf8_scan(p + i, m - i, &cp, &need);
		size_t cl = l > 0 ? (size_t)l : 1;
		int32_t id = sl_tok_lookup2(t, (const char *)p + i, cl, "", 0);
		bool fb = id < 0 && t->byte_fallback;
		for (size_t j = 0; fb && j < cl; j++)
			fb = t->fallback_id[p[i + j]] >= 0;
		if (id >= 0) {
			init[k++] = id;
			prev_unk = false;
		} else if (fb) {
			for (size_t j = 0; j < cl; j++)
				init[k++] = t->fallback_id[p[i + j]];
			prev_unk = false;
		} else if (t->unk_id >= 0) {
			if (!(t->fuse_unk && prev_unk))
				init[k++] = t->unk_id;
			prev_unk = true;
		}
		i += cl;
	}
	return k;
}

/* BPE one pre-token of m bytes at p, appending its ids to w. */
int sl_tok_bpe(const sl_tokenizer *t, struct sl_tok_work *w, const uint8_t *p, size_t m)
{
	if (m > SL_TOK_MAX_WORD)
		return sl_err(SL_EINVAL, "tokenizer: a word of %zu bytes is too long", m);
	if (t->ignore_merges) {
		/* a word in the vocabulary is one token, merges or not */
		int32_t id = -1;
		if (t->byte_level) {
			SL_TRY(sl_tok_grow((void **)&w->buf, &w->buf_cap, 2 * m, 1));
			size_t n = 0;
			for (size_t i = 0; i < m; i++) {
				memcpy(w->buf + n, t->byte_utf8[p[i]], t->byte_utf8_len[p[i]]);
				n += t->byte_utf8_len[p[i]];
			}
			id = sl_tok_lookup2(t, w->buf, n, "", 0);
		} else {
			id = sl_tok_lookup2(t, (const char *)p, m, "", 0);
		}
		if (id >= 0)
			return sl_tok_push_id(w, id);
	}
	SL_TRY(sl_tok_grow((void **)&w->init, &w->init_cap, m, sizeof *w->init));
	int32_t k = 0;
	if (t->byte_level) {
		for (size_t i = 0; i < m; i++)
			if (t->byte_id[p[i]] >= 0) /* no token for it and no unk: dropped */
				w->init[k++] = t->byte_id[p[i]];
	} else {
		k = sl_tok_chars(t, p, m, w->init);
	}
	if (k == 0)
		return 0;
	if (k == 1)
		return sl_tok_push_id(w, w->init[0]);
	if (k <= SL_TOK_SMALL_WORD)
		return sl_tok_bpe_small(t, w, w->init, (int)k);
	return sl_tok_bpe_heap(t, w, w->init, k);
}
