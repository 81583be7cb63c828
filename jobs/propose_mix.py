r"""Propose mixing weights over candidate pretraining sources from their similarity to the target text.

    python jobs/propose_mix.py --config candidates.yaml \
        --target BC5CDR-chemical=../shared/data/ner/BC5CDR-chem-IOB/train.tsv HoC=../shared/data/hoc/train.tsv \
        out_dir=runs/proposal
    python jobs/propose_mix.py --config candidates.yaml scores=runs/selection weighting.name=top_k weighting.k=1
    python jobs/propose_mix.py                      # tiny preset: the bundled sample corpus and task text

Scores every source of ``corpus:`` (the candidates) against the targets with seed 004's measures
(or reuses a jobs/score_sources.py output with ``scores=``), weights them by a rule (``weighting``:
softmax of -JSD / 0.1 by default) and writes ``<out_dir>/corpus.yaml``, a corpus config with the
weighted mixer that ``jobs/build_corpus.py --config`` and an experiment arm's ``corpus_from`` read.
``--target FILE...`` is a shorthand for ``targets=[...]``; everything else is the common job interface.
"""
from __future__ import annotations

import argparse
import json
import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.workflows.propose_mix import ProposalConfig, plan, run

SPEC = JobSpec(name="propose_mix", description=(__doc__ or "").split("\n\n")[0], config_cls=ProposalConfig, run=run,
               dry_run=plan, default_preset="tiny",
               outputs=("out_dir",))


def target_overrides(argv: list[str]) -> list[str]:
    """Turn ``--target A B ...`` into a ``targets=[...]`` override placed among the user's overrides."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--target", nargs="+", action="extend", default=[])
    known, rest = pre.parse_known_args(argv)
    if not known.target:
        return rest
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:at] + ["targets=" + json.dumps(known.target)] + rest[at:]


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, target_overrides(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
