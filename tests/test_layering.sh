#!/bin/sh
# test_layering.sh SRC - the dependency direction docs/DESIGN.md states,
# checked on the sources' includes: offload/ includes only headers of
# offload/, kernels/ and common/ (never the runtime's); the KV cache
# (runtime/kvcache.[ch]) knows the model only through its environment: it
# includes no model.h and reads no sl_model field.
set -u
src=${1:?usage: test_layering.sh SRC}
fail=0

bad() {
	echo "layering: $*" >&2
	fail=1
}

# the quoted includes of a file, one per line
includes() {
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$1"
}

for f in "$src"/offload/*.c "$src"/offload/*.h; do
	[ -e "$f" ] || continue
	for h in $(includes "$f"); do
		found=
		for d in offload kernels common; do
			[ -e "$src/$d/$h" ] && found=$d
		done
		[ -n "$found" ] || bad "${f#"$src"/} includes $h, which is not in offload/, kernels/ or common/"
	done
done

for f in "$src"/runtime/kvcache.c "$src"/runtime/kvcache.h; do
	for h in $(includes "$f"); do
		[ "$h" = model.h ] && bad "${f#"$src"/} includes model.h (the cache's environment is sl_kv_env)"
	done
	if grep -n 'sl_model \*\|\bm->' "$f" >/dev/null; then
		bad "${f#"$src"/} takes an sl_model * or reads m-> fields: $(grep -n 'sl_model \*\|\bm->' "$f" | head -3 | tr '\n' ' ')"
	fi
done

[ "$fail" = 0 ] && echo "layering: ok"
exit "$fail"
