"""The analyses across an experiment's arms, beside its sweep: source scoring (seed 004), cross-lingual
retrieval (seed 002, Table 6), the arms' tokenizer quality (seed 002, Figure 3) and what each arm trained
on (its instances' counts, its phases' passes over them). Each reads the arms the runner built
(``orchestrator.workflows.runner.ArmPlan``); a failing analysis is said in the report's notes and never stops
the experiment.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from orchestrator.core.artifacts import pair_cut_share
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_manifest
from orchestrator.core.reuse import made_under_at, reusable, run_stage
from orchestrator.corpus.sources import source_files
from orchestrator.corpus.stage import CorpusConfig
from orchestrator.formats import READERS
from orchestrator.pretrain.config import data_passes
from orchestrator.retrieval.table import render_section
from orchestrator.selection.arms import read_scores, score_arm
from orchestrator.selection.settings import scoring_key
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.space import space_tasks, task_data_dir
from orchestrator.track import schema as S
from orchestrator.vocab.quality import CSS as QUALITY_CSS
from orchestrator.vocab.quality import QUALITY_TITLE
from orchestrator.vocab.quality import render_html as quality_html
from orchestrator.vocab.quality import render_markdown as quality_markdown
from orchestrator.workflows.config import ExperimentConfig
from orchestrator.workflows.runner import STAGES_DIR, ArmPlan

log = logging.getLogger("experiment")


# ---------------------------------------------------------------------------------------------
# Source scoring (seed 004) in an experiment: what is scored against what

def selection_sources(corpus: CorpusConfig) -> list[tuple[str, str, str]]:
    """An arm's pretraining text as scoring inputs: every file of its corpus sources, each with its
    source's format and text field (``orchestrator.selection.arms.File``)."""
    return [(str(path), src.format, src.text_field) for src in corpus.sources for path in source_files(src)]


def selection_targets(sweep: SweepConfig) -> dict[str, list[tuple[str, str, str]]]:
    """The target text: the training split of every task of the sweep (the whole split, not the
    ``max_train_examples`` subset), by the task's display name as the results name it. A token
    file is read with its own format; BLUE TSV layouts by their header (``auto``)."""
    targets = {}
    for task, spec in space_tasks(sweep.space).items():
        flat = dataclasses.replace(spec, dir="")
        path = flat.split_path(Path(task_data_dir(sweep, task, spec)), "all" if spec.cv_folds else "train")
        targets[spec.name] = [(str(path), spec.format if spec.format in READERS else "auto", "text")]
    return targets



# ---------------------------------------------------------------------------------------------
# Source scoring (seed 004): every pretraining arm's sources against the sweep's tasks

def _scoring_outputs(cfg: ExperimentConfig, arms) -> tuple[dict[str, tuple[str, Path, list]], dict[str, list]]:
    """{arm: (key, output directory, source files)} for the arms that pretrain, and the targets."""
    targets = selection_targets(cfg.sweep)
    outputs = {}
    for arm in arms:
        if arm.kind == "pretrain":
            sources = selection_sources(arm.config.corpus)
            key = scoring_key(cfg.selection, sources, targets)
            outputs[arm.name] = (key, cfg.run_dir / STAGES_DIR / "selection" / key, sources)
    return outputs, targets


def selection_plan(cfg: ExperimentConfig, plans: dict[str, ArmPlan]) -> str:
    """The dry run's section: which arms are scored (shared by key), against which task text."""
    from orchestrator.selection.measures import kenlm_binary, read_units, tokenize  # heavy: numpy

    outputs, targets = _scoring_outputs(cfg, plans.values())
    s = cfg.selection
    lines = [f"== source scoring (seed 004): {len(outputs)} pretraining arm(s) x {len(targets)} task(s); "
             f"{s.num_samples} sub-samples x {s.sample_tokens} tokens; lmplz {kenlm_binary('lmplz')} ==",
             "  targets: " + ", ".join(f"{task} ({files[0][0]})" for task, files in targets.items())]
    by_key: dict[str, list[str]] = {}
    for name, (key, _, _) in outputs.items():
        by_key.setdefault(key, []).append(name)
    for key, names in by_key.items():
        done = reusable(outputs[names[0]][1], key)
        state = "reused" if done else "build"
        sources = outputs[names[0]][2]
        tokens = sum(len(tokenize(u)) for f, fmt, tf in sources for u in read_units(f, fmt, tf))  # every file parses
        if tokens < s.sample_tokens and s.short_source == "error":  # the run would stop there: say so now
            raise InputError(sources[0][0], f"the source(s) of arm(s) {', '.join(names)} hold {tokens} tokens, "
                                            f"fewer than selection.sample_tokens={s.sample_tokens}",
                             expected="a larger source, a smaller selection.sample_tokens, or "
                                      "selection.short_source=whole")
        short = "" if tokens >= s.sample_tokens else "; fewer than sample_tokens: scored whole"
        files = ", ".join(Path(f).name for f, _, _ in sources)
        lines.append(f"  {'selection':<16} {key[:12]}  {state:<6}  {', '.join(names)}  "
                     f"({files}: {tokens} tokens{short})" + (made_under_at(outputs[names[0]][1]) if done else ""))
    arms, seeds = len(outputs) - (cfg.baseline_arm in outputs), len(cfg.sweep.space.seeds)
    lines.append(f"  the report correlates each measure with each arm's gain over {cfg.baseline_arm}, paired by "
                 f"seed ({arms} arm(s) x {seeds} seed(s) = {arms * seeds} point(s) per column, {arms} value(s) of "
                 "each measure)")
    return "\n".join(lines)


def score_arms(cfg: ExperimentConfig, arms: list[ArmPlan]) -> tuple[dict[str, dict], list[str]]:
    """Each pretraining arm's scores (built or reused by key under the run directory's stages/); an
    arm whose scoring fails is left out of the correlations, and said so in the report's notes."""
    from orchestrator.track.runs import log_stage_result  # heavy: mlflow

    outputs, targets = _scoring_outputs(cfg, arms)
    scores, notes = {}, []
    for name, (key, out, sources) in outputs.items():
        try:
            run_stage("selection", out, key, lambda tmp, n=name, src=sources: score_arm(n, cfg.selection, src,
                                                                                       targets, tmp),
                      f"source scoring ({name})")
            scores[name] = read_scores(out)
            log_stage_result(cfg.tracking, cfg.run_dir, stage=S.KIND_SELECTION, params=cfg.selection,
                             metrics=_score_metrics(scores[name]), tags={S.ARM: name, S.OUTPUT_KEY: key})
        except Exception as exc:  # the analysis of one arm never stops the experiment
            log.error("source scoring of arm %s failed: %s: %s", name, type(exc).__name__, exc)
            notes.append(f"Source scoring of arm {name} failed: {type(exc).__name__}: {exc}")
    return scores, notes


def _score_metrics(scores: dict) -> dict[str, float]:
    """An arm's scores as the metrics of its source-scoring run (``orchestrator.track.schema``)."""
    metrics = {S.source_metric(m): v for m, v in scores["measures"].items()}
    for task, measures in scores.get("by_task", {}).items():
        metrics.update({S.source_metric(m, task): v for m, v in measures.items()})
    return metrics


# ---------------------------------------------------------------------------------------------
# Cross-lingual retrieval (seed 002, Table 6): every arm's encoder on parallel text, no fine-tuning

def retrieval_models(cfg: ExperimentConfig, arms) -> dict[str, Path]:
    """The encoders compared: each arm's model in arm order (an augmented arm's encoder is its base
    model's: augmentation changes fine-tuning only, so it has no column of its own), then retrieval.models."""
    models = {a.name: a.model_dir for a in arms if not a.augmented}
    models.update({name: Path(path) for name, path in cfg.retrieval.models.items()})
    return models


def check_retrieval_inputs(cfg: ExperimentConfig) -> list:
    """The text parses and aligns and the extra models are BERT directories; returns the parallel sets."""
    from orchestrator.retrieval.stage import check_model, load_sets  # heavy: the stage's implementation

    for name, path in cfg.retrieval.models.items():
        check_model(name, path)
    return load_sets(cfg.retrieval)


def retrieval_plan(cfg: ExperimentConfig, plans: dict[str, ArmPlan]) -> str:
    """The dry run's section: the text (parsed and aligned), the encoders, one task per encoder and side."""
    from orchestrator.retrieval.stage import plan_sets  # heavy: the stage's implementation

    sets = check_retrieval_inputs(cfg)
    models = retrieval_models(cfg, plans.values())
    sides = sum(len(s.languages) for s in sets)
    lines = [f"== cross-lingual retrieval (seed 002, Table 6): {len(models)} encoder(s), {len(models) * sides} "
             "embedding task(s) on Ray, after the arms are built =="]
    lines += [f"  {line}" for line in plan_sets(cfg.retrieval, sets)]
    lines.append("  encoders: " + ", ".join(models))
    return "\n".join(lines)


def retrieve_arms(cfg: ExperimentConfig, arms: list[ArmPlan]) -> tuple[tuple[Path, dict] | None, list[str]]:
    """Every finished arm's encoder (and retrieval.models) evaluated in one output,
    ``<run_dir>/stages/retrieval/<key>`` (reused by key), each logged as a child run tagged by arm. A
    failure is said in the report's notes: the analysis never stops the experiment."""
    from orchestrator.retrieval.stage import retrieval_stage  # heavy: the stage's implementation

    models = retrieval_models(cfg, arms)
    if not models:
        return None, []
    root = cfg.run_dir / STAGES_DIR / "retrieval"
    try:
        out, results = retrieval_stage(cfg.retrieval, models, lambda key: root / key, cfg.tracking, cfg.run_dir,
                                       tags={a.name: {S.ARM: a.name} for a in arms})
    except Exception as exc:
        log.error("cross-lingual retrieval failed: %s: %s", type(exc).__name__, exc)
        return None, [f"Cross-lingual retrieval failed: {type(exc).__name__}: {exc}"]
    log.info("cross-lingual retrieval: %s", out / "table.md")
    return (out, results), []


def retrieval_section(retrieval: tuple[Path, dict]) -> tuple[str, str]:
    """The retrieval tables as a (Markdown, HTML) section of the experiment's report."""
    _, results = retrieval
    return render_section(results)


# ---------------------------------------------------------------------------------------------
# Tokenizer quality (seed 002, Figure 3): what each arm's vocabulary stage measured (vocab.quality)

def quality_rows(arms) -> list[dict]:
    """The tokenizer-quality rows of the arms' vocabularies (``tokenizer_quality.json`` of each vocab
    output), the stage's own tokenizer named by the arms that share it ("conventional, floor"), every
    other tokenizer once; grouped by text set. [] when no arm's vocabulary stage measured any."""
    shared: dict[Path, list[str]] = {}
    for arm in arms:
        for out in arm.outputs:
            if out.stage == "vocab" and (out.path / "tokenizer_quality.json").is_file():
                shared.setdefault(out.path, []).append(arm.name)
    rows, seen = [], set()
    for path, names in shared.items():
        for row in json.loads((path / "tokenizer_quality.json").read_text(encoding="utf-8")):
            name = ", ".join(names) if row["tokenizer"] == "vocab" else row["tokenizer"]
            if (row["language"], row["kind"], name) not in seen:
                seen.add((row["language"], row["kind"], name))
                rows.append({**row, "tokenizer": name})
    texts = list(dict.fromkeys((r["language"], r["kind"]) for r in rows))
    return sorted(rows, key=lambda r: texts.index((r["language"], r["kind"])))


def quality_section(rows: list[dict]) -> tuple[str, str]:
    """The arms' tokenizer-quality table as a (Markdown, HTML) section of the experiment's report."""
    title = f"{QUALITY_TITLE} (seed 002, Figure 3)"
    return quality_markdown(rows, title), f"<style>{QUALITY_CSS}</style>\n" + quality_html(rows, title)


# ---------------------------------------------------------------------------------------------
# What each pretraining arm trained on: its instances' counts and its phases' passes over them

def training_rows(arms) -> list[dict]:
    """Per pretraining arm and phase, its instances (the instances stage's manifest ``counts``: instances,
    tokens, masked tokens, random-next pairs, pair tokens cut) and the phase's passes over them at its steps;
    a count the manifest lacks (made before it was counted) is None. An arm that did not pretrain here has one
    row with a ``note`` (a given model, the random initialisation). Rendered by
    ``orchestrator.report.training_data``."""
    rows = []
    for arm in arms:
        if arm.kind != "pretrain":
            made_by = f" (made by {arm.made_by})" if arm.made_by else ""
            rows.append({"arm": arm.name, "note": "random initialisation: no pretraining data" if arm.kind == "random"
                         else f"given model {arm.model_dir}{made_by}: not pretrained by this experiment"})
            continue
        outputs = {o.name: o.path for o in arm.outputs}
        for phase_name, phase in arm.config.pretrain.active_phases():
            path = outputs.get(f"instances/len{phase.max_seq_length}")
            try:
                manifest = read_manifest(path)
                c = manifest["counts"]
                instances, tokens = int(c["instances"]), int(c["tokens"])
            except (OSError, TypeError, ValueError, KeyError) as exc:  # a row says so; the report is still written
                rows.append({"arm": arm.name, "phase": phase_name, "note": f"{phase_name}: no instances manifest "
                             f"of length {phase.max_seq_length} read ({type(exc).__name__})"})
                continue
            rows.append({"arm": arm.name, "phase": phase_name, "max_seq_length": phase.max_seq_length,
                         "nsp": arm.config.pretrain.model.objective == "mlm_nsp",  # else the pairs' labels unread
                         "masking": c.get("masking") or manifest.get("masking"), "instances": instances,
                         "tokens": tokens,
                         **{k: c.get(k) for k in ("masked_tokens", "random_next", "pair_tokens_cut", "pairs_cut")},
                         "pair_cut_share": pair_cut_share(c),
                         "passes": data_passes(phase.steps, phase.global_batch_size, instances)})
    return rows
