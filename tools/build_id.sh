#!/bin/sh
# build_id.sh SRC - the build id that meson's vcs_tag writes into
# sl_build_id at every build: the commit (git describe --always
# --abbrev=12), and where the tree has changes not committed "-dirty-" and
# the first 12 hex digits of a SHA-256 of them (the diff against HEAD, and
# the untracked files git does not ignore, names and contents), so that
# every change to the code gives another id: a rebuilt sluice never reuses
# a hardware profile cached by other code.  Outside a git checkout it
# exits non-zero, and vcs_tag writes its fallback ("unknown").
set -eu
src=${1:?usage: build_id.sh SRC}
cd "$src"
id=$(git describe --always --abbrev=12 2>/dev/null) || exit 1
untracked=$(git ls-files --others --exclude-standard)
if git diff --quiet HEAD -- && [ -z "$untracked" ]; then
	echo "$id"
	exit 0
fi
sum=$({
	git diff HEAD --binary --no-ext-diff --no-color --
	git ls-files -z --others --exclude-standard | xargs -0 -r sha256sum --
} | sha256sum | cut -c1-12)
echo "$id-dirty-$sum"
