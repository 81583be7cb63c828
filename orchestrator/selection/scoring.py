"""Which pretraining source is closest to the target task text? (seed 004, Dai et al. 2020).

For each source, five sub-samples of N tokens (10M in the seed) are drawn; on each:

- **PPL**: a Kneser-Ney 3-gram model built with KenLM's ``lmplz`` on the sample, and the
  perplexity of the target text under it (lower = closer);
- **JSD**: Jensen-Shannon divergence, base 2 (so in [0, 1]), between the source's and the
  target's distribution over all 1- to 3-grams pooled (lower = closer);
- **TVC**: the share of the target's content-word types that occur in the sample (higher =
  closer). Content words are nouns, verbs and adjectives in the seed. No offline POS tagger
  ships its model inside a PyPI package we can trust here (spaCy's models come from GitHub
  releases, NLTK's and flair's taggers are downloaded at run time), so this uses a documented
  proxy: alphabetic tokens of two or more letters that are not English function words
  (``FUNCTION_WORDS``: closed-class determiners, pronouns, prepositions, conjunctions,
  auxiliaries and a few frequent adverbs). Adverbs outside that list count as content words;
- **TTR**: type-token ratio of the sample (diversity of the source, no direction).

Each measure is the mean over the sub-samples. All text is lowercased and split by
``tokenize`` (words with inner hyphens/apostrophes/periods kept, each other punctuation mark
a token) before any measure, so every source and target is seen the same way. Perplexity
follows KenLM: </s> counts as a word, out-of-vocabulary words are scored as <unk>.

Targets are grouped into tasks (``target_tasks``). The headline scores (``scores.json``,
``{source: {ppl, jsd, tvc, ttr}}``) are against all target text pooled; the same sub-sample,
n-gram counts and model also give per-task scores (``scores_by_task.json``), which is what the
seed correlates with per-task gains (300 source-task-seed points in its Figure 3).

Files are read by ``orchestrator.formats`` (``read_units``). Pure functions (sampling plan,
JSD/TVC/TTR, perplexity) are tested without Ray; ``score_source`` scores one source, and the job
(``orchestrator.workflows.score_sources``) fans the sources out as Ray tasks.
"""
from __future__ import annotations

import contextlib
import logging
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.formats import SUFFIXES, text_units

log = logging.getLogger(__name__)

MEASURES = ("ppl", "jsd", "tvc", "ttr")
#: +1: higher is closer to the target, -1: lower is closer, 0: no direction (diversity).
CLOSER = {"ppl": -1, "jsd": -1, "tvc": 1, "ttr": 0}
_TOKEN = re.compile(r"\w+(?:[-'.]\w+)*|[^\w\s]")
_WORD = re.compile(r"[^\W\d_]{2,}(?:[-'][^\W\d_]+)*")

FUNCTION_WORDS = frozenset("""
a about above across after afterwards against all almost along already also although always am among
amongst an and another any anybody anyone anything anywhere are around as at be because been before
beforehand behind being below beside besides between beyond both but by can cannot could did do does
doing done down during each either else elsewhere enough etc even ever every everybody everyone
everything everywhere except few for from further had has have having he hence her here hereafter
hereby herein hers herself him himself his how however i if in indeed into is it its itself just
least less many may me meanwhile might mine more moreover most mostly much must my myself namely
neither never nevertheless no nobody none noone nor not nothing now nowhere of off often on once one
only onto or other others otherwise our ours ourselves out over own per perhaps please quite rather
same several shall she should since so some somebody someone something sometime sometimes somewhere
still such than that the their theirs them themselves then thence there thereafter thereby therefore
therein thereupon these they this those though through throughout thru thus to together too toward
towards under unless until up upon us very via was we well were what whatever when whence whenever
where whereafter whereas whereby wherein whereupon wherever whether which while whither who whoever
whole whom whose why will with within without would yet you your yours yourself yourselves
'll 're 's 've n't ca wo st nd rd th et al vs ie eg
""".split())


@dataclass(frozen=True)
class SelectionConfig:
    targets: list[str] = field(
        default_factory=list, help="target task files (text, JSONL, parquet, IOB, BLUE TSV), each PATH or TASK=PATH; "
                                   "files of one task are scored together (default task name: the folder for "
                                   "train/dev/devel/test files, else the file stem)")
    sources: dict[str, str] = field(default_factory=dict, help="source name -> file or directory of files")
    out_dir: str = field("runs/selection", help="output directory: scores.json, table.txt, manifest.json")
    sample_tokens: int = field(10_000_000, help="tokens per sub-sample of each source (10M in the seed)")
    num_samples: int = field(5, help="sub-samples per source; each measure is their mean (5 in the seed)")
    order: int = field(3, help="n-gram order of the KenLM model and of the JSD term distribution")
    seed: int = field(0, help="seed of the sub-sampling")
    short_source: Literal["error", "whole"] = field(
        "error", help="a source with fewer than sample_tokens tokens: 'error' stops naming the file; "
                      "'whole' scores the whole source in every sub-sample (logged, recorded in scores.json)")
    input_format: Literal["auto", "text", "wikitext", "jsonl", "parquet", "iob", "conll", "blue_ner", "blue_tsv",
                          "blue"] = field(
        "auto", help="reader for every input (orchestrator.formats; blue = blue_tsv); auto: by suffix, and a .tsv "
                     "by its first row (IOB / BLUE NER rows end in a tag, a BLUE header names a sentence column)")
    text_field: str = field("text", help="JSONL key / parquet column holding the text")
    gains: dict[str, list[float]] = field(
        default_factory=dict, help="downstream gain per source (one value per task x seed); if given, the "
                                   "Pearson correlation of each measure with the gain is reported (seed Fig. 3)")
    task_gains: dict[str, dict[str, list[float]]] = field(
        default_factory=dict, help="downstream gain per target task and source ({task: {source: [gains]}}): "
                                   "Pearson r over (source, task) points with per-task measures, as the seed's "
                                   "Figure 3 does")
    lmplz_memory: str = field("1G", help="lmplz -S: memory for n-gram counting (e.g. 1G, 20%)")
    work_dir: str = field("", help="where the tokenized source copy and samples go while scoring "
                                   "(as large as the source); empty = the system temp directory")
    parallel: bool = field(True, help="score sources as parallel Ray tasks (false: one after another in-process)")
    num_cpus: int = field(0, help="CPUs for the embedded local Ray (0 = all)")

    def __post_init__(self) -> None:
        if self.sample_tokens < 1:
            raise ConfigError(f"sample_tokens must be >= 1, got {self.sample_tokens}")
        if self.num_samples < 1:
            raise ConfigError(f"num_samples must be >= 1, got {self.num_samples}")
        if not 1 <= self.order <= 6:
            raise ConfigError(f"order must be in 1..6, got {self.order}")
        if self.num_cpus < 0:
            raise ConfigError(f"num_cpus must be >= 0 (0 = all), got {self.num_cpus}")
        unknown = sorted(set(self.gains).union(*self.task_gains.values()) - set(self.sources))
        if unknown:
            raise ConfigError(f"gains given for unknown source {unknown[0]!r}; sources: {sorted(self.sources)}")
        tasks = set(target_tasks(self.targets))
        missing = sorted(set(self.task_gains) - tasks)
        if missing:
            raise ConfigError(f"task_gains given for unknown task {missing[0]!r}; tasks: {sorted(tasks)}")


# ----------------------------------------------------------------------------- tokenizing
def tokenize(text: str) -> list[str]:
    """Lowercased word and punctuation tokens, the one view of text every measure uses."""
    return _TOKEN.findall(text.lower())


def is_content_word(token: str) -> bool:
    """Proxy for noun/verb/adjective (no offline POS tagger available): see module docstring."""
    return token not in FUNCTION_WORDS and _WORD.fullmatch(token) is not None


# ----------------------------------------------------------------------------- readers
def read_units(path: str | Path, fmt: str = "auto", text_field: str = "text") -> Iterator[str]:
    """Text units of one file (``orchestrator.formats.text_units``): lines of text, JSONL/parquet
    records, sentences of token files (tokens joined by spaces) and of BLUE TSV rows."""
    return text_units(path, "blue_tsv" if fmt == "blue" else fmt, text_field)


def input_files(path: str | Path) -> list[Path]:
    """A file, or every file with a known suffix under a directory (sorted, for determinism)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise InputError(path, "directory holds no readable files", expected=f"files ending in {SUFFIXES}")
        return files
    if not path.exists():
        raise InputError(path, "file not found")
    return [path]


# ----------------------------------------------------------------------------- target profile
@dataclass(frozen=True)
class TargetProfile:
    """Everything the measures need from the target text, computed once."""
    lines: tuple[str, ...]          # tokenized units joined by spaces (the PPL test set)
    ngrams: Mapping[str, int]       # pooled 1..order-gram counts
    ngram_total: int
    content_vocab: frozenset[str]   # content-word types (TVC denominator)
    tokens: int


def ngrams(tokens: Sequence[str], order: int) -> Iterator[str]:
    """All 1..order-grams of one unit, as space-joined strings (never across units)."""
    for n in range(1, order + 1):
        for i in range(len(tokens) - n + 1):
            yield " ".join(tokens[i:i + n])


SPLIT_NAMES = ("train", "dev", "devel", "test", "valid", "validation")


def target_tasks(targets: Sequence[str]) -> dict[str, list[str]]:
    """{task: [paths]} from 'PATH' or 'TASK=PATH' entries; default task: folder of a split file, else stem."""
    tasks: dict[str, list[str]] = {}
    for item in targets:
        name, sep, path = item.partition("=")
        if not sep:
            p = Path(item)
            name, path = (p.parent.name if p.stem.lower() in SPLIT_NAMES and p.parent.name else p.stem), item
        tasks.setdefault(name, []).append(path)
    return tasks


def merge_profiles(profiles: Iterable[TargetProfile]) -> TargetProfile:
    """One profile for the pooled target text of several tasks."""
    lines, counts, vocab, tokens = [], Counter(), set(), 0
    for p in profiles:
        lines.extend(p.lines)
        counts.update(p.ngrams)
        vocab |= p.content_vocab
        tokens += p.tokens
    return TargetProfile(lines=tuple(lines), ngrams=dict(counts), ngram_total=sum(counts.values()),
                         content_vocab=frozenset(vocab), tokens=tokens)


def profile_target(units: Iterable[str], order: int = 3) -> TargetProfile:
    lines, counts, vocab, total_tokens = [], Counter(), set(), 0
    for unit in units:
        toks = tokenize(unit)
        if not toks:
            continue
        lines.append(" ".join(toks))
        counts.update(ngrams(toks, order))
        vocab.update(t for t in toks if is_content_word(t))
        total_tokens += len(toks)
    return TargetProfile(lines=tuple(lines), ngrams=dict(counts), ngram_total=sum(counts.values()),
                         content_vocab=frozenset(vocab), tokens=total_tokens)


# ----------------------------------------------------------------------------- measures
def jensen_shannon(target: Mapping[str, int], target_total: int, source: Mapping[str, int],
                   source_total: int) -> float:
    """Jensen-Shannon divergence, base 2, between two n-gram count distributions.

    ``source`` may hold only the target's keys: all source mass outside them contributes
    q/2 bits (there p = 0, so q log2(q / (q/2)) / 2), which needs only ``source_total``.
    Equals ``scipy.spatial.distance.jensenshannon(p, q, base=2) ** 2`` (scipy returns the
    distance, the square root of the divergence).
    """
    if target_total <= 0 or source_total <= 0:
        raise ValueError("both distributions need a positive total")
    bits, q_inside = 0.0, 0.0
    for key, count in target.items():
        p = count / target_total
        q = source.get(key, 0) / source_total
        q_inside += q
        if q == 0.0:
            bits += p
        else:
            m = p + q
            bits += p * math.log2(2 * p / m) + q * math.log2(2 * q / m)
    bits += max(0.0, 1.0 - q_inside)
    return min(1.0, max(0.0, bits / 2))


def type_token_ratio(types: int, tokens: int) -> float:
    return types / tokens if tokens else 0.0


def vocabulary_covered(target_vocab: frozenset[str], source_types: Iterable[str] | set[str]) -> float:
    """Share of the target's content-word types present in the source."""
    if not target_vocab:
        return 0.0
    present = source_types if isinstance(source_types, (set, frozenset)) else set(source_types)
    return len(target_vocab & present) / len(target_vocab)


def perplexity(model, lines: Iterable[str]) -> float:
    """Corpus perplexity under a kenlm.Model, </s> counted as a word (KenLM's convention; OOVs scored as <unk>)."""
    log10, words = 0.0, 0
    for line in lines:
        log10 += model.score(line, bos=True, eos=True)
        words += line.count(" ") + 2
    return float(10.0 ** (-log10 / words))


def plan_samples(unit_tokens: np.ndarray, sample_tokens: int, num_samples: int, rng: np.random.Generator,
                 ) -> list[dict[int, int]]:
    """Per sub-sample: {unit index: tokens to take}: random units until exactly ``sample_tokens``.

    Units are drawn without replacement in a random order; the last one is cut so every sample
    holds exactly ``sample_tokens`` tokens. Needs ``sum(unit_tokens) >= sample_tokens``.
    """
    total = int(unit_tokens.sum())
    if total < sample_tokens:
        raise ValueError(f"{total} tokens < sample_tokens={sample_tokens}")
    plans = []
    for _ in range(num_samples):
        order = rng.permutation(len(unit_tokens))
        cum = np.cumsum(unit_tokens[order])
        last = int(np.searchsorted(cum, sample_tokens))
        plan = {int(u): int(unit_tokens[u]) for u in order[:last + 1]}
        plan[int(order[last])] -= int(cum[last]) - sample_tokens
        plans.append({u: n for u, n in plan.items() if n > 0})
    return plans


# ----------------------------------------------------------------------------- KenLM
def kenlm_binary(name: str) -> str:
    """``lmplz`` / ``build_binary`` next to this interpreter (the project venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise OrchestratorError(f"KenLM's {name} was not found next to {sys.executable} or on PATH: "
                            f"run scripts/setup.sh (it builds lmplz and build_binary into the venv)")


def build_kenlm(text_file: Path, work: Path, order: int, memory: str):
    """Kneser-Ney model with lmplz (discount fallback for tiny samples), binarized, loaded."""
    import kenlm  # heavy: kenlm

    arpa, binary = work / "model.arpa", work / "model.bin"
    cmd = [kenlm_binary("lmplz"), "-o", str(order), "-S", memory, "-T", str(work), "--discount_fallback",
           "--text", str(text_file), "--arpa", str(arpa)]
    for step in (cmd, [kenlm_binary("build_binary"), str(arpa), str(binary)]):
        res = subprocess.run(step, capture_output=True, text=True)
        if res.returncode != 0:
            raise OrchestratorError(f"{Path(step[0]).name} failed on {text_file} (exit {res.returncode}): "
                                    f"{res.stderr.strip()[-800:]}")
    arpa.unlink()
    return kenlm.Model(str(binary))


# ----------------------------------------------------------------------------- one source
@dataclass(frozen=True)
class SourceScore:
    name: str
    ppl: float
    jsd: float
    tvc: float
    ttr: float
    samples: tuple[dict, ...]       # per sub-sample measures
    tokens: int                     # tokens in the whole source
    sample_tokens: int              # tokens per sub-sample actually used
    whole: bool                     # True when the source was shorter than sample_tokens
    by_task: dict[str, dict[str, float]]  # per target task: mean measures (TTR is the source's own)

    def measures(self) -> dict[str, float]:
        return {m: getattr(self, m) for m in MEASURES}


#: One input file of a source: (path, reader format, JSONL key / parquet column).
InputFile = tuple[Path, str, str]


def _tokenize_source(files: Sequence[InputFile], out: Path) -> np.ndarray:
    """Write the tokenized source, one unit per line; return tokens per unit."""
    counts = []
    with open(out, "w", encoding="utf-8") as f:
        for path, fmt, text_field in files:
            for unit in read_units(path, fmt, text_field):
                toks = tokenize(unit)
                if toks:
                    f.write(" ".join(toks) + "\n")
                    counts.append(len(toks))
    return np.asarray(counts, dtype=np.int64)


def score_source(name: str, path: str | Path | Sequence[InputFile], targets: Mapping[str, TargetProfile],
                 cfg: SelectionConfig) -> SourceScore:
    """All four measures for one source, each the mean over ``cfg.num_samples`` sub-samples.

    ``targets`` maps task names to profiles; the pooled target (all tasks) gives the headline
    measures, each task its own (the same sample, n-gram counts and KenLM model serve all).
    ``path`` is a file or a directory read with ``cfg.input_format``, or a list of
    (file, format, text field) for a source whose files differ in format (an experiment arm's corpus).
    """
    if isinstance(path, (str, Path)):
        files = [(f, cfg.input_format, cfg.text_field) for f in input_files(path)]
    else:
        files = [(Path(f), fmt, text_field) for f, fmt, text_field in path]
        path = ", ".join(str(f) for f, _, _ in files)
    pooled = merge_profiles(targets.values()) if len(targets) > 1 else next(iter(targets.values()))
    with tempfile.TemporaryDirectory(prefix=f"score-{name}-", dir=cfg.work_dir or None) as tmp:
        work = Path(tmp)
        unit_tokens = _tokenize_source(files, work / "tokens.txt")
        total = int(unit_tokens.sum())
        if total == 0:
            raise InputError(path, "holds no text", expected="at least one token")
        whole = total < cfg.sample_tokens
        if whole and cfg.short_source == "error":
            raise InputError(path, f"source {name!r} has {total} tokens, fewer than sample_tokens="
                                   f"{cfg.sample_tokens}",
                             expected="a larger source, a smaller sample_tokens, or short_source=whole")
        if whole:
            log.warning("%s: %d tokens < sample_tokens=%d: every sub-sample is the whole source",
                        name, total, cfg.sample_tokens)
        size = min(total, cfg.sample_tokens)
        rng = np.random.default_rng([cfg.seed, zlib.crc32(name.encode())])
        plans = plan_samples(unit_tokens, size, cfg.num_samples, rng)
        sample_files = [work / f"sample-{i}.txt" for i in range(len(plans))]
        _write_samples(work / "tokens.txt", unit_tokens, plans, sample_files)
        samples = []
        for i, sample in enumerate(sample_files):
            start = time.perf_counter()
            samples.append(_measure_sample(sample, pooled, targets, cfg, work / f"lm-{i}"))
            samples[-1]["seconds"] = round(time.perf_counter() - start, 3)
            log.info("%s sample %d/%d: %s", name, i + 1, len(sample_files),
                     {k: samples[-1][k] for k in (*MEASURES, "seconds")})
    mean = {m: float(np.mean([s[m] for s in samples])) for m in MEASURES}
    by_task = {task: {m: float(np.mean([s["by_task"][task][m] for s in samples])) for m in MEASURES}
               for task in targets}
    return SourceScore(name=name, samples=tuple(samples), tokens=total, sample_tokens=size, whole=whole,
                       by_task=by_task, **mean)


def _write_samples(tokens_file: Path, unit_tokens: np.ndarray, plans: list[dict[int, int]],
                   sample_files: list[Path]) -> None:
    """One streaming pass over the tokenized source, each unit copied (cut if planned) into its samples."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(p, "w", encoding="utf-8")) for p in sample_files]
        source = stack.enter_context(open(tokens_file, encoding="utf-8"))
        for unit, line in enumerate(source):
            for plan, handle in zip(plans, handles):
                take = plan.get(unit)
                if take:
                    handle.write(line if take == unit_tokens[unit] else " ".join(line.split()[:take]) + "\n")


def _measure_sample(sample: Path, pooled: TargetProfile, targets: Mapping[str, TargetProfile],
                    cfg: SelectionConfig, work: Path) -> dict:
    """Pooled measures plus ``by_task``; source n-grams are counted once, on the pooled target's keys."""
    work.mkdir()
    on_target: Counter = Counter()
    types: set[str] = set()
    tokens = ngram_total = 0
    keys = pooled.ngrams
    with open(sample, encoding="utf-8") as f:
        for line in f:
            toks = line.split()
            tokens += len(toks)
            types.update(toks)
            for gram in ngrams(toks, cfg.order):
                ngram_total += 1
                if gram in keys:
                    on_target[gram] += 1
    model = build_kenlm(sample, work, cfg.order, cfg.lmplz_memory)
    ttr = type_token_ratio(len(types), tokens)

    def measures(t: TargetProfile) -> dict[str, float]:
        # each task's keys are a subset of the pooled keys, so the restricted counts serve it too
        return {"ppl": perplexity(model, t.lines),
                "jsd": jensen_shannon(t.ngrams, t.ngram_total, on_target, ngram_total),
                "tvc": vocabulary_covered(t.content_vocab, types), "ttr": ttr}

    by_task = {task: measures(t) for task, t in targets.items()}
    overall = measures(pooled) if len(targets) > 1 else dict(next(iter(by_task.values())))

    return {**overall, "by_task": by_task}


# ----------------------------------------------------------------------------- many sources
def correlations(scores: Mapping[str, Mapping[str, float]], gains: Mapping[str, Sequence[float]]) -> dict:
    """Pearson r of each measure with the downstream gain, one point per (source, gain value).

    Raw r: a useful similarity measure shows r < 0 for PPL and JSD (lower = closer) and r > 0
    for TVC. With fewer than 3 points or a constant series r is None, with the reason.
    """
    from scipy.stats import pearsonr  # heavy: scipy

    points = [(name, g) for name, values in gains.items() if name in scores for g in values]
    out = {}
    for m in MEASURES:
        x = [scores[name][m] for name, _ in points]
        y = [g for _, g in points]
        if len(points) < 3:
            out[m] = {"r": None, "p": None, "n": len(points), "why": "fewer than 3 points"}
        elif len(set(x)) < 2 or len(set(y)) < 2:
            out[m] = {"r": None, "p": None, "n": len(points), "why": "constant series"}
        else:
            res = pearsonr(x, y)
            out[m] = {"r": float(res.statistic), "p": float(res.pvalue), "n": len(points)}
    return out


def task_correlations(by_task: Mapping[str, Mapping[str, Mapping[str, float]]],
                      task_gains: Mapping[str, Mapping[str, Sequence[float]]]) -> dict:
    """Pearson r over (source, task, gain) points with each task's own measures (seed Figure 3)."""
    keyed = {f"{task}\t{src}": by_task[task][src] for task in task_gains for src in task_gains[task]}
    gains = {f"{task}\t{src}": values for task, per in task_gains.items() for src, values in per.items()}
    return correlations(keyed, gains)


def ranked_table(scores: Mapping[str, Mapping[str, float]]) -> str:
    """Sources closest first by JSD (the seed's strongest correlate); each measure's rank in brackets."""
    names = sorted(scores, key=lambda n: (scores[n]["jsd"], n))
    ranks = {}
    for m in ("ppl", "jsd", "tvc"):
        ordered = sorted(scores, key=lambda n: CLOSER[m] * -scores[n][m])
        ranks[m] = {n: i + 1 for i, n in enumerate(ordered)}
    width = max(6, *(len(n) for n in names))
    lines = [f"{'#':>2}  {'source':<{width}}  {'PPL (lower)':>16}  {'JSD (lower)':>14}  {'TVC (higher)':>14}  "
             f"{'TTR':>7}"]
    for i, n in enumerate(names, 1):
        s = scores[n]
        lines.append(f"{i:>2}  {n:<{width}}  {s['ppl']:>12.1f} [{ranks['ppl'][n]}]  {s['jsd']:>10.4f} "
                     f"[{ranks['jsd'][n]}]  {s['tvc']:>10.4f} [{ranks['tvc'][n]}]  {s['ttr']:>7.4f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the targets
def load_targets(cfg: SelectionConfig) -> dict[str, TargetProfile]:
    """{task: profile} of the target files, grouped by task name (see ``target_tasks``)."""
    if not cfg.targets:
        raise ConfigError("no targets: give --target FILE... or targets=[...]")
    profiles = {}
    for task, paths in target_tasks(cfg.targets).items():
        files = [f for p in paths for f in input_files(p)]
        profiles[task] = profile_target(
            (u for f in files for u in read_units(f, cfg.input_format, cfg.text_field)), cfg.order)
        if profiles[task].tokens == 0:
            raise InputError(", ".join(map(str, files)), f"target task {task!r} holds no text",
                             expected="target task text")
    return profiles


__all__ = ["SelectionConfig", "SourceScore", "InputFile", "TargetProfile", "MEASURES", "FUNCTION_WORDS",
           "score_source", "load_targets", "target_tasks", "merge_profiles", "profile_target", "tokenize",
           "is_content_word", "read_units", "input_files", "ngrams", "jensen_shannon", "type_token_ratio",
           "vocabulary_covered", "perplexity", "plan_samples", "kenlm_binary", "build_kenlm", "correlations",
           "task_correlations", "ranked_table"]
