"""The augmentation stage on Ray Data: planned rows -> MLM actor pool -> augmented task directory.

    result = augment_task(spec, data_dir, out_dir, model_dir, AugmentConfig(), SimilarityConfig(),
                          AugmentRayConfig())

Each actor loads the MLM and the fastText vectors once and augments whole batches of rows with
batched forward passes (``FilteredAugmenter.augment``). Rows are planned on the driver with
per-row seeds, so the output is the same for any number of actors or batch size.

Output directory (a drop-in task directory for the sweep):

    <train file>         original sentences (optional) + augmented ones, in the task's format
    <dev/test files>     copied unchanged
    replacements.jsonl   per augmented sentence: replaced words, rejected proposals, kept words
    examples.md          accepted and rejected replacements in context, to judge the filter
    manifest.json        config, inputs, counts (replaced words, rejected candidates, unchanged ...)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.filtered import (
    FilteredAugmenter,
    MaskedWordPredictor,
    check_mlm_dir,
    plan_rows,
    repeat_rows,
)
from orchestrator.augment.similarity import WordVectors, check_vectors, train_vectors, vectors_key
from orchestrator.core.config import from_dict, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import (
    atomic_write_text,
    file_digests,
    hash_inputs,
    make_private,
    private_dir,
    read_manifest,
    write_manifest,
)
from orchestrator.core.reuse import KEY_FIELD, content_key, model_identity, relocated_key, stamp
from orchestrator.core.runtime import check_fits, possible_gpus, ray_session
from orchestrator.finetune.readers import Example, fixed_subset, read_split
from orchestrator.finetune.spec import TaskSpec

log = logging.getLogger(__name__)

REPLACEMENTS = "replacements.jsonl"
EXAMPLES = "examples.md"


@dataclasses.dataclass
class AugmentResult:
    out_dir: Path
    counts: dict[str, int]
    seconds: float

    def summary(self) -> str:
        c = self.counts
        return (f"augmented {c['augmented_sentences']} sentences from {c['sentences']} in {self.seconds:.1f} s: "
                f"{c['replaced_words']} words replaced, {c['rejected_candidates']} proposals rejected, "
                f"{c['unchanged_sentences']} sentences unchanged -> {self.out_dir}")


# ------------------------------------------------------------------------------------ the actors
class AugmentActor:
    """Ray Data callable class: model and vectors loaded once per actor."""

    def __init__(self, cfg: dict, model_dir: str, vectors: str, center: bool, device: str, threads: int):
        import torch  # heavy: torch

        # one torch thread per actor unless whole CPUs are given: single-thread actors side by side
        # use small matrices better than one multi-thread process, and torch's OpenMP threads
        # spin-wait for each other, which collapses when other jobs share the cores (RESULTS.md)
        torch.set_num_threads(max(1, threads))
        acfg = AugmentConfig(**cfg)
        predictor = MaskedWordPredictor(model_dir, device=device, max_seq_length=acfg.max_seq_length,
                                        batch_size=acfg.batch_size)
        self.augmenter = FilteredAugmenter(acfg, predictor, WordVectors(vectors, center=center).similarity)

    def __call__(self, batch: dict) -> dict:
        import numpy as np  # heavy: numpy

        began, cpu = time.time(), time.process_time()
        rows = [json.loads(text) for text in batch["row"]]
        results = self.augmenter.augment(rows)
        n = len(results)
        return {"uid": np.asarray([r["uid"] for r in results]),
                "result": np.asarray([json.dumps(r) for r in results], dtype=object),
                "began": np.full(n, began), "ended": np.full(n, time.time()),
                "cpu_s": np.full(n, (time.process_time() - cpu) / max(1, n))}


def _actor_gpus(ray_cfg: AugmentRayConfig, device: str) -> float:
    if device == "cpu":
        return 0.0
    if ray_cfg.gpus_per_actor >= 0:
        return ray_cfg.gpus_per_actor
    return 1.0 if possible_gpus() > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class CallStats:
    """One batch of actor results as it arrives: how many rows, when the actor call began and
    ended (``time.time()`` on the actor), and the CPU seconds the actor process spent on them."""

    rows: int
    began: float
    ended: float
    cpu_s: float


def rows_per_call(cfg: AugmentConfig) -> int:
    """Rows an actor augments per call: enough masked inputs (k per row) for full same-length
    forward passes, few enough that the last calls do not leave the other actors idle for long."""
    return max(1, cfg.batch_size // 2)


def run_actor_pool(rows: list[dict], cfg: AugmentConfig, model_dir: Path, vectors: Path, center: bool,
                   ray_cfg: AugmentRayConfig, device: str = "auto",
                   progress: Callable[[CallStats], None] | None = None) -> list[dict]:
    """Augment planned rows on a Ray Data actor pool (Ray must be initialised); results by uid.
    ``progress`` is called as each batch of results arrives."""
    import ray  # heavy: ray

    if not rows:
        return []
    gpus = _actor_gpus(ray_cfg, device)
    check_fits({"CPU": ray_cfg.cpus_per_actor, "GPU": gpus},
               "the augmentation's ray.cpus_per_actor / ray.gpus_per_actor", "actor")
    actor_device = "cuda" if gpus > 0 else "cpu"
    per_call = rows_per_call(cfg)
    ds = ray.data.from_items([{"uid": r["uid"], "row": json.dumps(r)} for r in rows],
                             override_num_blocks=max(ray_cfg.actors, -(-len(rows) // per_call)))
    ds = ds.map_batches(AugmentActor, batch_size=per_call, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=ray_cfg.actors, max_tasks_in_flight_per_actor=1),
                        fn_constructor_kwargs={"cfg": to_dict(cfg), "model_dir": str(model_dir),
                                               "vectors": str(vectors), "center": center,
                                               "device": actor_device,
                                               "threads": int(ray_cfg.cpus_per_actor)},
                        num_cpus=ray_cfg.cpus_per_actor, num_gpus=gpus)
    results = []
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        results.extend(json.loads(r) for r in batch["result"])
        if progress is not None:
            progress(CallStats(len(batch["result"]), float(batch["began"].min()), float(batch["ended"].max()),
                               float(batch["cpu_s"].sum())))
    results.sort(key=lambda r: r["uid"])
    if [r["uid"] for r in results] != [r["uid"] for r in rows]:
        raise RuntimeError("augmentation lost or duplicated rows")  # a Ray Data contract, not user input
    return results


# ------------------------------------------------------------------------------------ the outputs
def format_token_file(spec: TaskSpec, sentences: list[tuple[list[str], list[str], str]]) -> str:
    """Sentences (tokens, tags, document id) in the task's own file format, so ``read_file``
    reads them back: 2 columns (iob, conll) or BLUE's 4 columns with bare B/I tags."""
    lines: list[str] = []
    for tokens, tags, doc in sentences:
        offset = 0
        for i, (tok, tag) in enumerate(zip(tokens, tags)):
            if spec.format == "blue_ner":
                bare = tag[:1] if spec.entity_type and tag.endswith(f"-{spec.entity_type}") else tag
                lines.append(f"{tok}\t{doc if i == 0 else '-'}\t{offset}\t{bare}")
                offset += len(tok) + 1
            else:
                lines.append(f"{tok}\t{tag}")
        lines.append("")
    return "\n".join(lines) + ("\n" if lines else "")


def _marked(tokens: list[str], pos: int, new: str) -> str:
    return " ".join(f"[{t} -> {new}]" if i == pos else t for i, t in enumerate(tokens))


def examples_markdown(rows: list[dict], results: list[dict], limit: int = 25) -> str:
    """Accepted and rejected replacements in their sentences, for a person to judge the filter."""
    accepted, rejected = [], []
    for row, res in zip(rows, results):
        for rep in res["replaced"]:
            if len(accepted) < limit:
                accepted.append(f"- cos {rep['similarity']:+.3f}, rank {rep['rank']}: "
                                f"{_marked(row['tokens'], rep['position'], rep['replacement'])}")
        for rej in res["rejected"]:
            if len(rejected) < limit and rej["similarity"] != 1.0:
                sim = "no vector" if rej["similarity"] is None else f"cos {rej['similarity']:+.3f}"
                rejected.append(f"- {sim}: {_marked(row['tokens'], rej['position'], rej['candidate'])}")
    return ("# Filtered-BERT replacements\n\n## Accepted\n\n" + "\n".join(accepted or ["(none)"])
            + "\n\n## Rejected by the similarity filter\n\n" + "\n".join(rejected or ["(none)"]) + "\n")


def count(rows: list[dict], results: list[dict], sentences: int) -> dict[str, int]:
    return {
        "sentences": sentences,
        "augmented_sentences": len(results),
        "masked_words": sum(len(r["positions"]) for r in rows),
        "replaced_words": sum(len(r["replaced"]) for r in results),
        "rejected_candidates": sum(len(r["rejected"]) for r in results),
        "words_kept": sum(len(r["kept"]) for r in results),
        "unchanged_sentences": sum(1 for r in results if not r["replaced"]),
        "sentences_without_eligible_words": sum(1 for r in rows if not r["positions"]),
    }


# ------------------------------------------------------------------------------------- the stage
def training_sentences(spec: TaskSpec, data_dir: Path, max_sentences: int = 0) -> list[Example]:
    """The training split, or the fixed subset that a sweep trial with ``max_train_examples`` =
    ``max_sentences`` trains on (the trial's own ``fixed_subset``, so the two cannot drift apart)."""
    if spec.family != "ner":
        raise ConfigError(f"task {spec.name} is family {spec.family}; augmentation needs token "
                          "classification (ner)")
    return fixed_subset(read_split(spec, data_dir, "train"), max_sentences)


def resolve_vectors(sim: SimilarityConfig, examples: list[Example], cache_dir: Path) -> Path:
    """The vectors file to filter with: given by path, or trained (and cached) on the corpus."""
    if sim.vectors:
        return check_vectors(sim.vectors)
    corpus = [Path(p) for p in sim.corpus]
    if not corpus:
        text = "\n".join(" ".join(ex.text_a) for ex in examples) + "\n"
        corpus = [atomic_write_text(cache_dir / "train_sentences.txt", text)]
    return train_vectors(sim, corpus, cache_dir)


def progress_log(total: int, every_s: float = 30.0) -> Callable[[CallStats], None]:
    """A ``run_actor_pool`` progress callback that logs the rows done at most every ``every_s``
    seconds, and once at the end."""
    done, last = 0, time.monotonic()

    def tick(call: CallStats) -> None:
        nonlocal done, last
        done += call.rows
        if done == total or time.monotonic() - last >= every_s:
            log.info("augmented %d/%d sentences", done, total)
            last = time.monotonic()
    return tick


def augment_task(spec: TaskSpec, data_dir: str | Path, out_dir: str | Path, model_dir: str | Path,
                 cfg: AugmentConfig, sim: SimilarityConfig, ray_cfg: AugmentRayConfig, *,
                 max_train_sentences: int = 0, device: str = "auto") -> AugmentResult:
    """Augment one NER task's training split into ``out_dir`` (dev/test copied): a fresh directory
    that ``orchestrator.core.reuse.run_stage`` renames into place. Starts an embedded Ray unless one
    is running."""
    started = time.monotonic()
    if spec.format not in ("iob", "conll", "blue_ner"):
        raise ConfigError(f"task {spec.name}: augmentation writes token-per-line files (iob, conll, blue_ner), not "
                          f"{spec.format}; convert the task's notes to IOB first (its readers yield the IOB words)")
    spec = dataclasses.replace(spec, dir="")
    data_dir, out_dir, model_dir = Path(data_dir), Path(out_dir), Path(model_dir)
    if cfg.method != "repeat":  # before vectors are trained and actors load the MLM
        check_mlm_dir(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    examples = training_sentences(spec, data_dir, max_train_sentences)
    cache_dir = Path(sim.cache_dir) if sim.cache_dir else out_dir.parent / "fasttext_cache"
    if spec.restricted:  # data-use agreement: nothing derived from its text is readable by other users
        private_dir(out_dir)
        private_dir(cache_dir)
    rows = plan_rows([(ex.text_a, ex.label) for ex in examples], cfg)
    if cfg.method == "repeat":  # the equal-steps control: no MLM, no vectors
        vectors = None
        log.info("repeating %d sentences into %d unchanged copies (the equal-steps control)", len(examples),
                 len(rows))
        results = repeat_rows(rows)
    else:
        vectors = resolve_vectors(sim, examples, cache_dir)
        log.info("augmenting %d sentences into %d (k=%d, %s masking) with %d actors", len(examples), len(rows),
                 cfg.words_per_sentence, cfg.mask_mode, ray_cfg.actors)
        with ray_session(address=ray_cfg.address or None):
            results = run_actor_pool(rows, cfg, model_dir, vectors, sim.center, ray_cfg, device,
                                     progress=progress_log(len(rows)))
    counts = count(rows, results, len(examples))
    originals = [(list(ex.text_a), list(ex.label), ex.doc or f"train-{ex.line}") for ex in examples]
    augmented = [(r["tokens"], r["tags"], f"aug{r['copy']}-{originals[r['source']][2]}") for r in results]
    train_name = spec.files["train"]
    atomic_write_text(out_dir / train_name, format_token_file(
        spec, (originals if cfg.include_original else []) + augmented))
    for split in ("dev", "test"):
        src = spec.split_path(data_dir, split)
        if not src.is_file():
            raise InputError(src, f"{split} split not found", expected=f"the task's {split} file")
        shutil.copyfile(src, out_dir / src.name)
    lines = [json.dumps({**{k: r[k] for k in ("uid", "copy", "replaced", "rejected", "kept")},
                         "source_line": examples[r["source"]].line}) for r in results]
    atomic_write_text(out_dir / REPLACEMENTS, "\n".join(lines) + "\n")
    atomic_write_text(out_dir / EXAMPLES, examples_markdown(rows, results))
    write_manifest(out_dir, stage="augment", seed=cfg.seed,
                   config={"task": spec.name, "format": spec.format, "augment": cfg, "similarity": sim,
                           "ray": ray_cfg, "max_train_sentences": max_train_sentences,
                           "model_dir": str(model_dir) if vectors else "", "vectors": str(vectors or "")},
                   inputs=[spec.split_path(data_dir, "train")] + ([model_dir, vectors] if vectors else []),
                   counts={**counts, "train_sentences_written": len(augmented) + (
                       len(originals) if cfg.include_original else 0)})
    if spec.restricted:
        make_private(out_dir)
    result = AugmentResult(out_dir, counts, time.monotonic() - started)
    log.info(result.summary())
    return result


def augment_key(spec: TaskSpec, data_dir: str | Path, model_dir: str | Path, cfg: AugmentConfig,
                sim: SimilarityConfig, max_train_sentences: int, out_dir: str | Path | None = None) -> str:
    """What an augmented task directory depends on: the task's files, the MLM, the settings and the contents of
    the vectors file or corpus ``sim`` names (method ``repeat`` reads neither the MLM nor the vectors, so they are
    not part of its key). With ``out_dir``, an output there made before those contents entered the key is
    stamped with it when it was filtered with these very vectors (``_adopt_earlier_key``); and one this config
    made from task files of these contents in another folder (a checkout cloned elsewhere: the bundled sample
    tasks; a task folder copied to another disk), and from a vectors file or corpus of these contents at other
    paths, answers with the key it records (``core.reuse.relocated_key``: the task files and ``sim``'s paths are
    in the key; ``_sim_at``)."""
    files = _task_files(spec, data_dir)
    inputs = similarity_inputs(sim)
    key = _augment_key(spec, files, model_dir, cfg, sim, max_train_sentences, inputs)
    if out_dir is None:
        return key
    if cfg.method != "repeat" and inputs:
        _adopt_earlier_key(Path(out_dir), key, earlier_key(spec, data_dir, model_dir, cfg, sim, max_train_sentences),
                           sim)

    def key_at(made: dict) -> str | None:
        at = _folder_at(spec, data_dir, files, made.get("inputs"))
        if at is None:
            return None
        moved = {str(at / Path(path).relative_to(data_dir)): sha for path, sha in files.items()}
        return _augment_key(spec, moved, model_dir, cfg, _sim_at(sim, made), max_train_sentences, inputs)

    return relocated_key("augment", key, out_dir, key_at, beside=False)


def earlier_key(spec: TaskSpec, data_dir: str | Path, model_dir: str | Path, cfg: AugmentConfig,
                sim: SimilarityConfig, max_train_sentences: int) -> str:
    """The key before the similarity inputs' contents were in it (session 53): their paths alone."""
    return _augment_key(spec, _task_files(spec, data_dir), model_dir, cfg, sim, max_train_sentences, {})


def _task_files(spec: TaskSpec, data_dir: str | Path) -> dict[str, str]:
    """{path: sha256} of the task's train, dev and test files in ``data_dir`` (those there)."""
    files = [spec.split_path(Path(data_dir), split) for split in ("train", "dev", "test")]
    return hash_inputs([f for f in files if f.is_file()])


def _augment_key(spec: TaskSpec, files: dict[str, str], model_dir: str | Path, cfg: AugmentConfig,
                 sim: SimilarityConfig, max_train_sentences: int, inputs: dict) -> str:
    # the task as it was keyed before ``release_dir`` (where BLUE's release keeps the files, whose hashes are
    # here) existed: with it, every augmented task was made again after an upgrade
    task = {k: v for k, v in to_dict(spec).items() if k != "release_dir"}
    if cfg.method == "repeat":
        return content_key("augment", task, files, cfg, max_train_sentences)
    return content_key("augment", task, files, model_identity(model_dir), cfg, sim, max_train_sentences,
                       *([inputs] if inputs else []))  # none: the key it always had


def _folder_at(spec: TaskSpec, data_dir: str | Path, files: dict[str, str], recorded) -> Path | None:
    """The folder an earlier augment output was made from: where its manifest's inputs (``recorded``) name its
    training file, when that held what the training file in ``data_dir`` holds now; else None."""
    train = spec.split_path(Path(data_dir), "train")
    name = train.relative_to(data_dir).parts
    if str(train) not in files or not isinstance(recorded, dict):
        return None
    for path, sha in recorded.items():
        parts = Path(path).parts
        if sha == files[str(train)] and parts[-len(name):] == name:
            return Path(*parts[:-len(name)])
    return None


def _sim_at(sim: SimilarityConfig, made: dict) -> SimilarityConfig:
    """``sim`` with the paths an earlier augment output's manifest (``made``) records for it: the vectors file and
    the corpus files (where ``sim`` names them too, as many: their contents now, in the key, must then be the ones
    recorded there) and ``cache_dir`` (where trained vectors are cached, named by their corpus's contents and the
    settings: it says nothing of the output, so whatever it was). Every other setting stays this config's."""
    config = made.get("config")
    recorded = config.get("similarity") if isinstance(config, dict) else None
    if not isinstance(recorded, dict):
        return sim
    paths: dict = {}
    if isinstance(recorded.get("cache_dir"), str):
        paths["cache_dir"] = recorded["cache_dir"]
    if sim.vectors and isinstance(recorded.get("vectors"), str) and recorded["vectors"]:
        paths["vectors"] = recorded["vectors"]
    corpus = recorded.get("corpus")
    if sim.corpus and isinstance(corpus, list) and len(corpus) == len(sim.corpus) and all(
            isinstance(path, str) for path in corpus):
        paths["corpus"] = tuple(corpus)
    return dataclasses.replace(sim, **paths)


def similarity_inputs(sim: SimilarityConfig) -> dict:
    """The contents of what the filter's vectors come from, where ``sim`` names it: the vectors file, or the
    corpus files they are trained on ({} for the task's own training sentences, already in the key). Their paths
    alone were in the key: an edited corpus or a vectors file replaced in place kept the old augmented task."""
    if sim.vectors:
        return {"vectors_sha256": _sha256(sim.vectors)}
    if sim.corpus:
        return {"corpus_sha256": [_sha256(path) for path in sim.corpus]}
    return {}


def _sha256(path: str | Path) -> str:
    """A file's sha256 through the per-user hash cache (``file_digests``: once while its size and modification
    time hold): a key is made for every (model, task), and a vectors file or corpus can be gigabytes."""
    return file_digests([Path(path)])[Path(path).name]


def _adopt_earlier_key(out_dir: Path, key: str, earlier: str, sim: SimilarityConfig) -> None:
    """An output recording ``earlier`` (its key before the similarity inputs' contents were in it) whose manifest
    shows it was filtered with the vectors ``sim`` gives now (the vectors file's recorded hash; trained vectors'
    cache folder, named by the corpus's contents and the settings) is stamped with ``key`` once, and reused."""
    try:
        manifest = read_manifest(out_dir)
    except (FileNotFoundError, InputError):  # none, or not readable: built anew
        return
    if manifest.get(KEY_FIELD) != earlier:
        return
    used = str((manifest.get("config") or {}).get("vectors") or "")  # what augment_task filtered with
    if sim.vectors:
        same = (manifest.get("inputs") or {}).get(used) == _sha256(sim.vectors)
    else:
        same = Path(used).parent.name == vectors_key(sim, sim.corpus)
    if same:
        stamp(out_dir, key)
        log.info("augment: %s recorded this task's earlier key; stamped with its key now", out_dir)


def from_format(spec: TaskSpec, fmt: str) -> TaskSpec:
    """``spec`` read as ``fmt`` (e.g. iob for 2-column files) instead of its own format."""
    return from_dict(TaskSpec, {**to_dict(spec), "format": fmt}, where=f"task {spec.name}")
