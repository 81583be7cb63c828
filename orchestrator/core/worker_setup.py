"""What every worker of a job's Ray runs as it starts (``runtime_env``'s ``worker_process_setup_hook``): an
embedded Ray's, ``quiet_embedded_ray``; an attached cluster's, ``follow_driver_directory``. Kept to the standard
library: every worker process imports it."""
from __future__ import annotations

import logging
import os

#: The job's working directory, which relative paths in its config name (``init_ray`` sets it for the workers)
DRIVER_CWD_ENV = "ORCH_DRIVER_CWD"

#: Ray Train's placement-group cleaner asks the state API once a second whether Train's controller still
#: lives. An embedded Ray runs no dashboard, so there is no state API: every ask fails with this warning,
#: once a second for a whole run (and nothing is lost: the placement group goes with the embedded Ray).
PLACEMENT_GROUP_CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_embedded_ray() -> None:
    logging.getLogger(PLACEMENT_GROUP_CLEANER).setLevel(logging.ERROR)


def follow_driver_directory() -> None:
    """A worker of an attached cluster starts in the directory its raylet started in (``ray start``'s): it moves
    to the job's, when this node has it, so a relative path reads and writes where the job's own checks did.
    On a node without that directory (no shared file system) it stays: relative paths could not work there."""
    cwd = os.environ.get(DRIVER_CWD_ENV, "")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
