#!/bin/sh
# test_build_id.sh SRC - tools/build_id.sh, the id the cached hardware
# profile is keyed by, on a git repository made here: a clean tree is its
# commit; every change not committed (an edit, another edit of the same
# file, an untracked file) gives another id, an ignored file none; a new
# commit another; outside a git checkout it fails (vcs_tag's fallback).
set -u
src=${1:?usage: test_build_id.sh SRC}
command -v git >/dev/null || { echo "test_build_id: no git: skipped"; exit 77; }
tmp=$(mktemp -d /tmp/sl_build_id_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() {
	echo "test_build_id: $*" >&2
	fail=1
}
id() { sh "$src/tools/build_id.sh" "$tmp/repo"; }

mkdir "$tmp/repo"
cd "$tmp/repo" || exit 1
git init -q . && git config user.email t@example.com && git config user.name t || exit 1
echo 'int x = 1;' >a.c
echo 'ignored/' >.gitignore
git add a.c .gitignore && git commit -qm one || exit 1
c1=$(git rev-parse --short=12 HEAD)
[ "$(id)" = "$c1" ] || bad "a clean tree: '$(id)', want '$c1'"

echo 'int x = 2;' >a.c
d1=$(id)
case $d1 in "$c1"-dirty-????????????) ;; *) bad "an edit: '$d1', want $c1-dirty-HASH" ;; esac
[ "$(id)" = "$d1" ] || bad "the same tree twice: '$(id)' then '$d1'"
echo 'int x = 3;' >a.c
d2=$(id)
[ "$d2" != "$d1" ] || bad "another edit of the same file kept the id $d1"
echo 'int x = 1;' >a.c
[ "$(id)" = "$c1" ] || bad "the edit undone: '$(id)', want '$c1'"

mkdir ignored && echo junk >ignored/x
[ "$(id)" = "$c1" ] || bad "an ignored file changed the id: '$(id)'"
echo 'int y;' >b.c
d3=$(id)
case $d3 in "$c1"-dirty-*) ;; *) bad "an untracked file: '$d3', want $c1-dirty-HASH" ;; esac
echo 'int y = 1;' >b.c
[ "$(id)" != "$d3" ] || bad "an untracked file's new content kept the id $d3"

git add b.c && git commit -qm two || exit 1
c2=$(git rev-parse --short=12 HEAD)
[ "$c2" != "$c1" ] && [ "$(id)" = "$c2" ] || bad "a new commit: '$(id)', want '$c2'"

mkdir "$tmp/plain"
if (cd / && GIT_CEILING_DIRECTORIES=$tmp sh "$src/tools/build_id.sh" "$tmp/plain") >/dev/null 2>&1; then
	bad "a folder outside git gave an id"
fi
[ $fail = 0 ] && echo "test_build_id: ok"
exit $fail
