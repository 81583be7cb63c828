"""Build a pretraining corpus: mix sources (conventional / SimPT / MDAPT) -> AmpV vocabulary -> instances.

    python jobs/build_corpus.py                                  # tiny preset on the shipped sample data
    python jobs/build_corpus.py --config my_corpus.yaml out_dir=runs/bio corpus.mixer.name=conventional
    python jobs/build_corpus.py --dry-run                        # check every source parses, print the plan
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.build_corpus import CorpusBuildConfig, plan, run

SPEC = JobSpec(
    name="build_corpus",
    description=(__doc__ or "").split("\n\n")[0],
    config_cls=CorpusBuildConfig,
    run=run,
    dry_run=plan,
    default_preset="tiny",
    outputs=("out_dir",),
)


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
