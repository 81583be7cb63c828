r"""Propose mixing weights over candidate pretraining sources from proxy runs (RegMix).

    python jobs/proxy_search.py --config configs/proxy_biomed.yaml      # the shared data, K = 16, ~15-25 min
    python jobs/proxy_search.py --config candidates.yaml \
        --target BC5CDR=../shared/data/ner/BC5CDR-chem-IOB/devel.tsv HoC=../shared/data/hoc/dev.tsv proxies=12
    python jobs/proxy_search.py                     # tiny preset: the bundled sample corpus, 4 proxies, ~1-2 min

Samples K mixtures of the ``corpus:`` sources (the candidates) from a Dirichlet around their natural
proportions, pretrains a tiny masked-LM BERT on each for the same token budget (every proxy a trial
of one Ray Tune run, on sources read and tokenized once), measures each proxy's MLM loss on the
held-out target text, fits a regression from weights to loss (cross-validated: its held-out
Spearman correlation is reported) and writes the mixture it predicts best as ``<out_dir>/corpus.yaml``,
the corpus config ``jobs/propose_mix.py`` writes (``mixer: weighted``), which ``jobs/build_corpus.py
--config`` and an experiment arm's ``corpus_from`` read. ``--target FILE...`` is a shorthand for
``targets=[...]``; everything else is the common job interface.
"""
from __future__ import annotations

import sys

from orchestrator.core.cli import JobSpec, run_job, shorthand_overrides
from orchestrator.workflows.proxy_search import ProxySearchConfig, plan, run

SPEC = JobSpec(name="proxy_search", description=(__doc__ or "").split("\n\n")[0], config_cls=ProxySearchConfig,
               run=run, dry_run=plan, default_preset="tiny",
               outputs=("out_dir", "work_dir"))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run_job(SPEC, shorthand_overrides(args, lists=[("--target", "targets")]))


if __name__ == "__main__":
    sys.exit(main())
