"""What every worker of an embedded Ray runs as it starts (``runtime_env``'s ``worker_process_setup_hook``).
Kept to the standard library: every worker process imports it."""
from __future__ import annotations

import logging

#: Ray Train's placement-group cleaner asks the state API once a second whether Train's controller still
#: lives. An embedded Ray runs no dashboard, so there is no state API: every ask fails with this warning,
#: once a second for a whole run (and nothing is lost: the placement group goes with the embedded Ray).
PLACEMENT_GROUP_CLEANER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_embedded_ray() -> None:
    logging.getLogger(PLACEMENT_GROUP_CLEANER).setLevel(logging.ERROR)
