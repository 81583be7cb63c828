#!/usr/bin/env bash
# Runs this checkout's tests with other torch and transformers versions than the lock's, on a CPU: by
# default the GPU host's (torch 2.11, transformers 5.17; benchmarks/RESULTS.md names them), so that code
# meant for the GPU is checked against its libraries before GPU time is spent on it.
#
#   scripts/compat_venv.sh                                # the whole suite
#   scripts/compat_venv.sh tests/test_bundle.py -x        # pytest's arguments
#   TORCH=2.11.0 TRANSFORMERS=5.17.0 scripts/compat_venv.sh
#
# It builds .compat/torch<T>-transformers<V>/, a venv that holds those two packages (and what they need
# that .venv lacks) and reads every other package from .venv, so run `scripts/setup.sh --test` first.
# torch comes from PyPI: its CUDA build, about 4 GB with its CUDA libraries, which runs on a CPU too.
# Two tests check this project's own locked environment or build and install its wheel; they fail in a
# side venv by design and are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TORCH=${TORCH:-2.11.0}
TRANSFORMERS=${TRANSFORMERS:-5.17.0}
MAIN="$ROOT/.venv"
[ -x "$MAIN/bin/python" ] || { echo "compat_venv: $MAIN/bin/python not found: run scripts/setup.sh --test first" >&2; exit 2; }
VENV="$ROOT/.compat/torch$TORCH-transformers$TRANSFORMERS"
log() { printf '[compat] %s\n' "$*"; }

if [ ! -f "$VENV/.done" ]; then
  log "building $VENV"
  rm -rf "$VENV"
  "$MAIN/bin/python" -m venv "$VENV"
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  main_site=$("$MAIN/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  # after this venv's own packages: .venv's, and this checkout (the project's editable install)
  printf '%s\n%s\n' "$main_site" "$ROOT" > "$site/zz_project_venv.pth"
  # what the tests run from next to the interpreter: binaries linked, .venv's Python scripts copied to
  # run on this venv's interpreter (the `ray` CLI the cluster tests start must import this torch)
  for tool in lmplz build_binary ruff lint-imports ray; do
    [ -e "$MAIN/bin/$tool" ] || continue
    if head -n1 "$MAIN/bin/$tool" | grep -q "^#!$MAIN/bin/python"; then
      sed "1s|.*|#!$VENV/bin/python|" "$MAIN/bin/$tool" > "$VENV/bin/$tool" && chmod +x "$VENV/bin/$tool"
    else
      ln -sf "$MAIN/bin/$tool" "$VENV/bin/$tool"
    fi
  done
  "$VENV/bin/pip" install -q "torch==$TORCH" "transformers==$TRANSFORMERS"
  touch "$VENV/.done"
fi
"$VENV/bin/python" -c "import torch, transformers; print(f'[compat] torch {torch.__version__}, transformers {transformers.__version__}')"
[ $# -gt 0 ] || set -- tests
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  --deselect tests/test_supply_chain.py::test_this_environment_is_the_locked_one \
  --deselect tests/test_install.py::test_wheel_install_runs_the_default_dry_run_elsewhere "$@"
