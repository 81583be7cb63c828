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

Files are read by ``orchestrator.formats`` (``read_units``). This module holds the pure functions
(tokenizing, target profiles, sampling plan, JSD/TVC/TTR, perplexity, correlations), tested without
Ray; ``orchestrator.selection.scoring`` scores a source with them and fans the sources out as Ray tasks.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.formats import SUFFIXES, text_units

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
    if not str(path).strip():  # Path("") is the working directory: every file under it would be read
        raise ConfigError("an input path is empty: give a file or a directory (an unset shell variable?)")
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
        if sep and not (name.strip() and path.strip()):
            raise ConfigError(f"target {item!r}: expected TASK=PATH with both given (an empty path would read the "
                              "working directory)")
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
