"""fastText's official package against gensim's FastText: one skipgram, one corpus, one run.

Issue 12 replaced a third-party fastText rebuild with the official ``fasttext`` sdist (built by
``scripts/setup.sh``) or gensim, to be chosen by a same-run comparison on the PubMed sample. Both
libraries train the same model with the same settings (``SimilarityConfig``'s defaults: skipgram,
dim 100, 25 epochs, min count 2, n-grams 3-6, 200k buckets, window 5, 5 negatives, lr 0.05,
sampling 1e-4, one thread) on the same normalised words, and are scored on the job the filter of
seed 001 gives them: a proposed replacement should be a word of the same kind.

- ``type_auc``: BC5CDR's one-word chemical and disease names that occur in the corpus at least 5
  times; the AUC of the centred cosine separating same-type pairs (chemical-chemical,
  disease-disease) from cross-type pairs (0.5 = chance, 1.0 = every same-type pair is closer).
- ``function_margin``: mean centred cosine of same-type entity pairs minus that of an entity word
  with a function word (the, of, was, ...), the swaps seed 001's ``cos > 0`` lets through.
- ``neighbour_overlap_at_10``: do the two learn the same space? Mean overlap of the 10 nearest
  neighbours of the 200 most frequent content words.
- ``train_s``: training wall time (the same thread count for both).

    .venv/bin/python benchmarks/fasttext_vs_gensim.py          # needs ../shared/data and gensim

The last line is JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from orchestrator.augment.config import SimilarityConfig
from orchestrator.augment.similarity import normalise_words

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FUNCTION_WORDS = ("the", "of", "in", "a", "and", "was", "were", "with", "for", "to", "by", "is")


def _fasttext(corpus: str, out: str, cfg: SimilarityConfig) -> float:
    import fasttext  # heavy: fasttext

    start = time.perf_counter()
    model = fasttext.train_unsupervised(corpus, model="skipgram", dim=cfg.dim, epoch=cfg.epochs,
                                        minCount=cfg.min_count, minn=cfg.minn, maxn=cfg.maxn, bucket=cfg.bucket,
                                        ws=5, neg=5, lr=0.05, t=1e-4, thread=1, verbose=0)
    seconds = time.perf_counter() - start
    words = model.words
    np.save(out, np.stack([model.get_word_vector(w) for w in words]))
    Path(out + ".words").write_text("\n".join(words), encoding="utf-8")
    return seconds


def _gensim(corpus: str, out: str, cfg: SimilarityConfig) -> float:
    from gensim.models import FastText  # heavy: gensim, the candidate library

    sentences = [line.split() for line in Path(corpus).read_text(encoding="utf-8").splitlines()]
    start = time.perf_counter()
    model = FastText(sentences, sg=1, vector_size=cfg.dim, epochs=cfg.epochs, min_count=cfg.min_count,
                     min_n=cfg.minn, max_n=cfg.maxn, bucket=cfg.bucket, window=5, negative=5, alpha=0.05,
                     sample=1e-4, workers=1, seed=1)
    seconds = time.perf_counter() - start
    words = list(model.wv.index_to_key)
    np.save(out, np.stack([model.wv[w] for w in words]))
    Path(out + ".words").write_text("\n".join(words), encoding="utf-8")
    return seconds


def train(library: str, corpus: str, work: Path, cfg: SimilarityConfig) -> tuple[dict[str, np.ndarray], float]:
    """Train in a fresh process (fastText is repeatable only there) and read the vectors back, centred."""
    out = str(work / library)
    fit = _fasttext if library == "fasttext" else _gensim
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seconds = pool.apply(fit, (corpus, out, cfg))
    matrix = np.load(out + ".npy")
    matrix = matrix - matrix.mean(axis=0)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    words = Path(out + ".words").read_text(encoding="utf-8").split("\n")
    return dict(zip(words, matrix)), seconds


def entity_words(counts: Counter, min_count: int = 5, per_type: int = 60) -> dict[str, list[str]]:
    """One-word entity names of BC5CDR's training files, by type, that the corpus has often enough."""
    found: dict[str, Counter] = {}
    for kind, folder in (("chemical", "BC5CDR-chem-IOB"), ("disease", "BC5CDR-disease-IOB")):
        names: Counter = Counter()
        lines = (SHARED / "ner" / folder / "train.tsv").read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            parts = line.split("\t")
            following = lines[i + 1].split("\t") if i + 1 < len(lines) else []
            if len(parts) == 2 and parts[1].startswith("B-") and not (len(following) == 2
                                                                       and following[1].startswith("I-")):
                word = " ".join(normalise_words(parts[0]))
                if word and " " not in word and counts[word] >= min_count:
                    names[word] += 1
        found[kind] = names
    both = set(found["chemical"]) & set(found["disease"])
    return {kind: [w for w, _ in names.most_common() if w not in both][:per_type] for kind, names in found.items()}


def auc(positive: list[float], negative: list[float]) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    scores = np.array(positive + negative)
    ranks = np.empty(len(scores))
    order = scores.argsort(kind="mergesort")
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    n_pos, n_neg = len(positive), len(negative)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def score(vectors: dict[str, np.ndarray], types: dict[str, list[str]]) -> dict[str, float]:
    def cos(a: str, b: str) -> float:
        return float(vectors[a] @ vectors[b])

    same = [cos(a, b) for words in types.values() for a, b in itertools.combinations(words, 2)]
    cross = [cos(a, b) for a in types["chemical"] for b in types["disease"]]
    function = [cos(a, f) for words in types.values() for a in words for f in FUNCTION_WORDS if f in vectors]
    return {"type_auc": round(auc(same, cross), 4),
            "function_margin": round(float(np.mean(same) - np.mean(function)), 4),
            "same_type_cos": round(float(np.mean(same)), 4), "cross_type_cos": round(float(np.mean(cross)), 4)}


def neighbour_overlap(a: dict[str, np.ndarray], b: dict[str, np.ndarray], probes: list[str], k: int = 10) -> float:
    shared = sorted(set(a) & set(b))
    ma, mb = np.stack([a[w] for w in shared]), np.stack([b[w] for w in shared])
    index = {w: i for i, w in enumerate(shared)}
    overlaps = []
    for word in probes:
        i = index[word]
        na = set(np.argsort(-(ma @ ma[i]))[1:k + 1])
        nb = set(np.argsort(-(mb @ mb[i]))[1:k + 1])
        overlaps.append(len(na & nb) / k)
    return round(float(np.mean(overlaps)), 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=SHARED / "pubmed_sample" / "PubMedAbstract_1MB.txt")
    p.add_argument("--epochs", type=int, default=SimilarityConfig().epochs)
    args = p.parse_args()
    cfg = SimilarityConfig(epochs=args.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        lines = [" ".join(normalise_words(line)) for line in args.corpus.read_text(encoding="utf-8").splitlines()]
        corpus.write_text("\n".join(line for line in lines if line) + "\n", encoding="utf-8")
        counts = Counter(w for line in lines for w in line.split())
        types = entity_words(counts)
        print(f"corpus: {sum(counts.values())} words, {len(counts)} types; entity words: "
              + ", ".join(f"{k} {len(v)}" for k, v in types.items()), flush=True)
        results, vectors = {}, {}
        for library in ("fasttext", "gensim"):
            vectors[library], seconds = train(library, str(corpus), work, cfg)
            results[library] = {"train_s": round(seconds, 1), "vocabulary": len(vectors[library]),
                                **score(vectors[library], types)}
            print(library, results[library], flush=True)
    content = [w for w, _ in counts.most_common() if w not in FUNCTION_WORDS and len(w) > 2]
    probes = [w for w in content if w in vectors["fasttext"] and w in vectors["gensim"]][:200]
    results["neighbour_overlap_at_10"] = neighbour_overlap(vectors["fasttext"], vectors["gensim"], probes)
    results["settings"] = {"dim": cfg.dim, "epochs": cfg.epochs, "min_count": cfg.min_count, "ngrams": [cfg.minn,
                           cfg.maxn], "bucket": cfg.bucket, "threads": 1, "corpus": args.corpus.name}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
