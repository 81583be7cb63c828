r"""Rank pretraining sources by closeness to target task text (seed 004): PPL, JSD, TVC, TTR.

    python jobs/score_sources.py --target ../shared/data/hoc/train.tsv ../shared/data/chemprot/dev.tsv \
        --source pubmed=../shared/data/pubmed_sample/PubMedAbstract_1MB.txt \
        --source wiki=../shared/data/general_en/wikitext2_tokenized \
        sample_tokens=50000 out_dir=runs/selection

``--target FILE...`` and ``--source NAME=PATH`` (repeatable) are shorthands for the config
keys ``targets`` and ``sources``; everything else is the common job interface (--config,
--preset, --dry-run, --print-config, dotted overrides such as ``gains.pubmed=[1.2,0.8]``).
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.core.cli import shorthand_overrides as cli_shorthands
from orchestrator.workflows.score_sources import SelectionConfig, plan, run


def shorthand_overrides(argv: list[str]) -> list[str]:
    """Turn --target/--source flags into ``targets=`` / ``sources=`` overrides; keep the rest."""
    return cli_shorthands(argv, named=(("--source", "sources", "NAME=PATH"),), lists=(("--target", "targets"),))


def main(argv: list[str] | None = None) -> int:
    spec = JobSpec(name="score_sources", description=__doc__ or "", config_cls=SelectionConfig, run=run,
                   dry_run=plan, outputs=("out_dir", "work_dir"))
    return run_job(spec, shorthand_overrides(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
