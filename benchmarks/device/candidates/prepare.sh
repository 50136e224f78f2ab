#!/bin/bash
# CPU side: build each named candidate into out/var<NAME>/ (a copy of HEAD's sources with the
# patch applied), checking its build hash against the table in README.md, and the committed
# build for the A/B's old library. Usage (repo root): bash benchmarks/device/candidates/prepare.sh NAME
set -euo pipefail
here=benchmarks/device/candidates
megamoe build --arch sm_90a > /dev/null
for name in "$@"; do
  patch=$(ls $here/${name}_s*.patch 2>/dev/null | head -1)
  [ -n "$patch" ] || { echo "prepare.sh: no patch $here/${name}_s*.patch" >&2; exit 2; }
  want=$(grep -F "| \`$(basename $patch)\`" $here/README.md | grep -o '`[0-9a-f]\{8\}`' | tr -d '`' || true)
  dir=out/var$name
  rm -rf $dir && mkdir -p $dir
  git archive HEAD megamoe csrc pyproject.toml sim benchmarks/device tests | tar -x -C $dir
  (cd $dir && git init -q && git apply ../../$patch)
  got=$(cd $dir && PYTHONPATH=$PWD python -c "from megamoe.kernel.build import build; print(build('sm_90a', strict=True).path)" | tail -1)
  echo "$name: $got"
  if [ -z "$want" ]; then  # a new patch: its row in README.md names this build
    echo "prepare.sh: README.md has no build for $(basename $patch) yet; it built $got" >&2
    continue
  fi
  case $got in
    */$want*) ;;
    *) echo "prepare.sh: $name built $got, README.md names $want" >&2; exit 1 ;;
  esac
done
