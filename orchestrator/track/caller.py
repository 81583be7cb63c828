"""The caller's MLflow session, kept apart from the tool's.

A job points MLflow at its run's store (``mlflow.set_tracking_uri``, which also exports
``$MLFLOW_TRACKING_URI``), sets its experiment and starts its parent runs there, and a stage's run
becomes a child of the run active in the process. Called as a library (a workflow's ``run`` from a
notebook), that left the caller's session pointing at the tool's store, made the tool's runs children
of a run the caller had left active in another store, and failed to start an experiment's parent run
beside it ("Run ... is already active"). Every workflow's ``run`` is wrapped in ``mlflow_state_kept``:

    @mlflow_state_kept()
    def run(cfg): ...

Inside it no run of the caller's is active and ``user_tracking_uri`` is the caller's
``$MLFLOW_TRACKING_URI`` as it was when the call began (whatever the order of the imports); after it,
the caller's tracking URI, experiment, environment and active runs are as they were. MLflow has no
public way to set active runs aside: this thread's run stack is swapped where it is the private list
MLflow 3 keeps (else the caller's runs stay active, as before).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

#: The environment MLflow's fluent API reads and ``set_tracking_uri``/``set_experiment`` write
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
_CALLER_URIS: list[str] = []  # the caller's $MLFLOW_TRACKING_URI at each open mlflow_state_kept, innermost last


def user_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` as the user set it: inside a workflow call, as it was when the call began
    (``mlflow.set_tracking_uri`` exports the variable, so it then holds the tool's own choice)."""
    return _CALLER_URIS[-1] if _CALLER_URIS else os.environ.get("MLFLOW_TRACKING_URI", "")


@contextlib.contextmanager
def stage_call() -> Iterator[None]:
    """``mlflow_state_kept`` for a stage API (``pretrain``, ``run_sweep``) a caller calls on its own; inside a
    workflow's call (one is open) nothing, so the stage's runs are children of the workflow's. Called twice from a
    notebook, the second experiment logged into the first one's store: MLflow had exported its URI, which then read
    as the user's own choice (probe L1)."""
    if _CALLER_URIS:
        yield
        return
    with mlflow_state_kept():
        yield


@contextlib.contextmanager
def mlflow_state_kept() -> Iterator[None]:
    """The block runs with none of the caller's MLflow runs active; after it, the caller's tracking URI,
    experiment, MLflow environment variables and active runs are as they were (see the module)."""
    env = {k: os.environ.get(k) for k in MLFLOW_ENV}
    _CALLER_URIS.append(env["MLFLOW_TRACKING_URI"] or "")
    mlflow = sys.modules.get("mlflow")  # not imported: nothing of the caller's to keep
    saved = _set_aside(mlflow) if mlflow is not None else None
    try:
        yield
    finally:
        _CALLER_URIS.pop()
        if "mlflow" in sys.modules:
            _give_back(saved)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _fluent() -> tuple[Any, Any] | None:
    """MLflow's fluent module and its tracking-URI module, where they hold the private state kept here."""
    try:
        from mlflow.tracking import fluent  # heavy: mlflow
        from mlflow.tracking._tracking_service import utils
    except ImportError:  # pragma: no cover - another MLflow layout
        return None
    if not all(hasattr(m, a) for m, a in ((fluent, "_active_run_stack"), (fluent, "_active_experiment_id"),
                                          (utils, "_tracking_uri"), (utils, "set_tracking_uri"))):
        return None  # pragma: no cover - another MLflow version
    return fluent, utils


def _set_aside(mlflow: Any) -> dict | None:
    """The caller's tracking URI, experiment and this thread's active runs; the runs taken off the stack."""
    found = _fluent()
    if found is None:
        log.debug("MLflow %s: its fluent state is not where this module looks; left as it is",
                  getattr(mlflow, "__version__", "?"))
        return None
    fluent, utils = found
    stack = fluent._active_run_stack.get()
    runs = list(stack)
    stack.clear()
    return {"uri": utils._tracking_uri, "experiment": fluent._active_experiment_id, "runs": runs}


def _give_back(saved: dict | None) -> None:
    found = _fluent()
    if found is None:
        return
    fluent, utils = found
    saved = saved or {"uri": None, "experiment": None, "runs": []}  # MLflow first imported inside: as it began
    utils.set_tracking_uri(saved["uri"])
    fluent._active_experiment_id = saved["experiment"]
    fluent._active_run_stack.get()[:] = saved["runs"]


__all__ = ["MLFLOW_ENV", "mlflow_state_kept", "user_tracking_uri"]
