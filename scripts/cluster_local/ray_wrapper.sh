#!/usr/bin/env bash
# Installed as `ray` first on the PATH of the local-provider test's remote shell.
# `ray stop` (run by `ray down`) stops only this cluster's head, found by its private --temp-dir
# ($ORCH_RAY_TEMP_DIR); every other ray command goes to the real CLI ($ORCH_RAY_BIN).
set -euo pipefail
if [ "${1:-}" = "stop" ]; then
  exec "${ORCH_PYTHON:?}" "${ORCH_STOP_HELPER:?}" "${ORCH_RAY_TEMP_DIR:?}"
fi
exec "${ORCH_RAY_BIN:?}" "$@"
