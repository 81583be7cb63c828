"""The instances stage: a finished corpus and vocabulary -> parquet shards of NSP + MLM instances.

    build_instances(cfg, corpus_dir, vocab_dir, out_dir, max_seq_length)   # out_dir/part-NNNNNN.parquet

One run per ``max_seq_length`` (``instances/len<L>/``). The manifest records what the
pretraining stage relies on: the length, the masking (static/dynamic) and its parameters, the
vocabulary's size and sha256, counts per source and per language (the corpus shards' language
column, carried into a ``language`` column of the instances), and what BERT's ``truncate_seq_pair``
cut to fit the length (``pair_tokens_cut``, ``pairs_cut``: counts, not in the stage's key).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from orchestrator.core.artifacts import MixPlan, ShardInfo, label_parts, load_plan, pair_cut_text
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import read_manifest, write_manifest
from orchestrator.core.pretokenize import pretokenize_of
from orchestrator.core.runtime import check_fits
from orchestrator.instances.association import (
    ASSOCIATION_DERIVATION_VERSION,
    ASSOCIATION_FILE,
    AssociationTable,
    derive_association,
    table_pairs,
    write_association,
)
from orchestrator.instances.config import InstanceConfig
from orchestrator.instances.entity_masking import EntityMasker
from orchestrator.instances.workers import count_cooccurrence, run_units

log = logging.getLogger(__name__)


def build_instances(cfg: InstanceConfig, corpus_dir: Path, vocab_dir: Path, out_dir: Path,
                    max_seq_length: int) -> Path:
    """Every unit of the corpus's mixing plan turned into instances of ``max_seq_length`` (Ray running)."""
    pretokenize = pretokenize_of(vocab_dir)
    if cfg.pretokenize not in ("auto", pretokenize):
        raise ConfigError(f"instances.pretokenize is {cfg.pretokenize} but the vocabulary {vocab_dir} splits words "
                          f"with {pretokenize}: set vocab.pretokenize={cfg.pretokenize}, or instances.pretokenize=auto")
    if capped := cfg.masking_capped(max_seq_length):
        log.warning("%s", capped)
    shards, plan = load_plan(corpus_dir, documents=False)
    by_path = {s.path: s for s in shards}
    workers = cfg.resolved_workers(len(plan.units))
    check_fits({"CPU": cfg.cpus_per_worker}, "instances.cpus_per_worker")
    build_cfg, association = cfg, {}
    if cfg.entity_masking is not None and cfg.entity_masking.association_method != "table":
        build_cfg, association = _derive(cfg, plan, vocab_dir, out_dir, workers)
    total = run_units(plan.units, vocab_dir, out_dir, build_cfg, max_seq_length, cfg.seed, workers,
                      cfg.cpus_per_worker)
    if total["instances"] == 0:
        raise InputError(corpus_dir, "no instances were created", expected="documents with tokens")
    vcounts = read_manifest(vocab_dir)["counts"]
    counts = {"max_seq_length": max_seq_length, "masking": cfg.masking,
              "vocab_size": vcounts["vocab_size"], "vocab_sha256": vcounts["vocab_sha256"],
              "instances": total["instances"], "tokens": total["tokens"],
              "masked_lm_prob": cfg.masked_lm_prob,
              "max_predictions_per_seq": cfg.max_predictions(max_seq_length),
              "whole_word_mask": cfg.whole_word_mask,
              "masked_tokens": total["masked"], "random_next": total["random_next"],
              "pair_tokens_cut": total["cut"], "pairs_cut": total["pairs_cut"],
              "units": len(plan.units), "document_uses": total["document_uses"], "pretokenize": pretokenize}
    if cfg.entity_masking is not None:
        counts["entity_masking"] = total["entity"]
    promised = ("max_seq_length", "masking", "vocab_size", "vocab_sha256", "masked_lm_prob",
                "max_predictions_per_seq", "whole_word_mask")
    write_manifest(out_dir, stage="instances", config=cfg, inputs=[corpus_dir, vocab_dir], counts=counts,
                   seed=cfg.seed, extra={"provenance": _provenance(plan, by_path, total),
                                         "languages": _by_language(total),
                                         **{k: counts[k] for k in promised},
                                         **({"association": association} if association else {})})
    log.info("instances len%d: %d instances, %d tokens; %s", max_seq_length, total["instances"], total["tokens"],
             pair_cut_text(counts))
    return out_dir


def _derive(cfg: InstanceConfig, plan: MixPlan, vocab_dir: Path, out_dir: Path, workers: int
            ) -> tuple[InstanceConfig, dict]:
    """The association derived from the plan's documents (a Ray Data pass before instance creation),
    written to ``out_dir/association.yaml``; the config the unit workers build with (that file as a
    table) and the manifest's record of the method, its parameters, counts and table."""
    em = cfg.entity_masking
    counts = count_cooccurrence(plan.units, vocab_dir, cfg, workers, cfg.cpus_per_worker)
    if counts.windows == 0:
        raise InputError(out_dir, "no text to derive the association from", expected="documents with tokens")
    table, rows = derive_association(counts, em.association_min_count)
    level = em.association_level
    path = write_association(table, out_dir / ASSOCIATION_FILE, header=(
        f"Degree of association derived from the corpus: 10 x max(0, NPMI) of two entity {level}s in one "
        f"{em.association_window}",
        f"({counts.windows} windows), pairs together in >= {em.association_min_count} windows; others 0. "
        f"Reusable as instances.entity_masking.association (with association_level: {level})."))
    if level == "term":  # thousands of terms: the manifest keeps the kept pairs and their terms' counts
        rows = [r for r in rows if r["kept"]]
        kept_terms = {t for r in rows for t in r["pair"]}
        windows_of = {t: c for t, c in counts.types.items() if t in kept_terms}
    else:
        windows_of = dict(counts.types)
    record = {"method": em.association_method, "level": level, "window": em.association_window,
              "min_count": em.association_min_count, "scale": "10 x max(0, NPMI), 3 decimals",
              "version": ASSOCIATION_DERIVATION_VERSION, "file": ASSOCIATION_FILE, "windows": counts.windows,
              f"{level}s_seen": len(counts.types), "pairs_counted": len(counts.pairs),
              f"{level}_windows": dict(sorted(windows_of.items())), "pair_statistics": rows,
              "table": {"default": table.default,
                        "pairs": table_pairs(table)}}
    log.info("association derived (%s of %ss, %s windows): %d of %d pairs kept", em.association_method, level,
             counts.windows, len(table.pairs), len(counts.pairs))
    built = dataclasses.replace(em, association=str(path), association_method="table")
    return dataclasses.replace(cfg, entity_masking=built), record


def _by_label_part(total: dict, part: int) -> dict[str, dict[str, int]]:
    """Instances and tokens per source (part 0) or language (part 1) of the workers' per-label counts."""
    out: dict[str, dict[str, int]] = {}
    for label, c in total["by_source"].items():
        agg = out.setdefault(label_parts(label)[part], {"instances": 0, "tokens": 0})
        agg["instances"] += c["instances"]
        agg["tokens"] += c["tokens"]
    return out


def _by_language(total: dict) -> dict[str, dict]:
    """Per language of segment A's document: instances, tokens and share of the tokens."""
    tokens_all = max(1, total["tokens"])
    return {lang or "unknown": {**c, "token_share": round(c["tokens"] / tokens_all, 4)}
            for lang, c in sorted(_by_label_part(total, 1).items())}


def _provenance(plan: MixPlan, by_path: dict[str, ShardInfo], total: dict) -> dict[str, dict]:
    """Per source: distinct documents used, instances and tokens (by segment A's document)."""
    by_source = _by_label_part(total, 0)
    rows: dict[str, set | None] = {}  # shard -> the rows its members take; None: all of them
    for unit in plan.units:
        for m in unit.members:
            if m.rows is None or rows.get(m.path, set()) is None:
                rows[m.path] = None
            else:
                rows.setdefault(m.path, set()).update(m.rows)
    docs: dict[str, int] = {}
    for path, taken in rows.items():
        shard = by_path[path]
        docs[shard.source] = docs.get(shard.source, 0) + (shard.n_docs if taken is None else len(taken))
    tokens_all = max(1, total["tokens"])
    out = {}
    for name in sorted(set(docs) | set(by_source)):
        c = by_source.get(name, {"instances": 0, "tokens": 0})
        out[name] = {"documents": docs.get(name, 0), "instances": c["instances"], "tokens": c["tokens"],
                     "token_share": round(c["tokens"] / tokens_all, 4)}
    return out


def plan_instances(cfg: InstanceConfig) -> str:
    """Dry run: what would be built (the entity-masking dictionaries and tables parse)."""
    em = cfg.entity_masking
    if em is not None and not em.ner_model:  # loads and checks the dictionaries and the association table
        EntityMasker(em, association=AssociationTable({}, 0.0) if em.association_method != "table" else None)
    line = (f"instances: max_seq_lengths={list(cfg.max_seq_lengths)}, masking={cfg.masking}, "
            f"whole_word_mask={cfg.whole_word_mask}, "
            f"entity_masking={'on' if cfg.entity_masking else 'off'}"
            f"{f' (same_type_grouping={em.same_type_grouping}, association={em.association_method})' if em else ''}, "
            f"seed={cfg.seed}")
    return "\n".join([line, *(said for n in cfg.max_seq_lengths if (said := cfg.masking_capped(n)))])
