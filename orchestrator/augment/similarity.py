"""fastText vectors for the similarity filter: trained here on a corpus, or read from a file.

A trained ``.bin`` keeps the subword n-grams, so a rare word or a word the MLM invents still
gets a vector; a ``.vec`` text file covers only its own vocabulary (an unknown word fails the
filter). Training uses one thread: fastText 0.9 has no seed and only thread=1 is repeatable.
"""
from __future__ import annotations

import importlib.metadata
import logging
import multiprocessing
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from orchestrator.augment.config import SimilarityConfig
from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.core.manifest import atomic_dir, file_sha256, is_complete, write_manifest
from orchestrator.core.reuse import content_key, output_lock
from orchestrator.formats.base import lines

log = logging.getLogger(__name__)

MODEL_FILE = "vectors.bin"
#: Suffixes ``WordVectors`` reads as vectors in text; any other file is loaded as a fastText ``.bin``.
TEXT_SUFFIXES = (".vec", ".txt")
VEC_FORMAT = "fastText .vec text: an optional 'count dim' header line, then 'word v1 ... vdim' per line"
#: The first int32 of every fastText ``.bin`` (fastText's FASTTEXT_FILEFORMAT_MAGIC_INT32).
FASTTEXT_MAGIC = 793712314
#: Vector lines a check reads: enough to see the header, the width and that it holds.
CHECKED_ROWS = 5
_WORD = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*")


def normalise_words(text: str) -> list[str]:
    """Lowercased words, punctuation dropped: how the corpus is fed to fastText and how a word is
    looked up, so 'Denies' and 'denies' share a vector."""
    return _WORD.findall(text.lower())


def cosine(u: np.ndarray | None, v: np.ndarray | None) -> float | None:
    """Cosine similarity, or None when either vector is missing or zero (no evidence either way)."""
    if u is None or v is None:
        return None
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    if nu == 0.0 or nv == 0.0:
        return None
    return float(np.dot(u, v) / (nu * nv))


class WordVectors:
    """Lookup of one word's vector from a fastText ``.bin`` or a ``.vec`` text file.

    ``center`` subtracts the vocabulary's mean vector. Vectors trained on a few MB share a large
    common direction (measured: every pair of words above cosine 0.7 on 1 MB of PubMed), which
    would let seed 001's ``cosine > 0`` pass everything; centred, unrelated words score near or
    below 0 and the threshold means what the seed meant with its large BioWordVec corpus.
    """

    def __init__(self, path: str | Path, center: bool = True):
        self.path = check_vectors(path)
        self._model = None
        self._table: dict[str, np.ndarray] = {}
        if self.path.suffix in TEXT_SUFFIXES:
            self._table = dict(_vec_rows(self.path))
        else:
            import fasttext  # heavy: fasttext

            try:
                self._model = fasttext.load_model(str(self.path))
            except ValueError as exc:
                raise InputError(self.path, f"not a fastText model: {exc}", expected="a fastText .bin") from None
        self._mean: np.ndarray | None = None
        if center:
            vocab = self._table.values() if self._model is None else map(self._model.get_word_vector,
                                                                           self._model.words)
            self._mean = np.mean(np.stack(list(vocab)), axis=0).astype(np.float32)

    def vector(self, word: str) -> np.ndarray | None:
        key = " ".join(normalise_words(word)) or word.lower()
        if self._model is not None:
            vec = np.asarray(self._model.get_word_vector(key), dtype=np.float32)
            if not vec.any():  # no known n-gram: fastText returns zeros
                return None
        else:
            vec = self._table.get(key)
            if vec is None:
                return None
        return vec if self._mean is None else vec - self._mean

    def similarity(self, a: str, b: str) -> float | None:
        return cosine(self.vector(a), self.vector(b))


def _vec_rows(path: Path, limit: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """(lowercased word, vector) per line of a ``.vec`` text file, the first ``limit`` only when > 0:
    an optional 'count dim' header on line 1, blank lines skipped, every other line 'word v1 ... vd'
    with finite numbers and one d throughout (the header's when it has one). Any other line, or a
    file without a vector, raises InputError naming the file and the line."""
    dim, rows = None, 0
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line_no, line in enumerate(f, 1):
            parts = line.rstrip().split(" ")
            if parts == [""]:
                continue
            if line_no == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                dim = int(parts[1])
                continue
            if len(parts) < 3:
                raise InputError(path, f"{line.strip()[:40]!r} is neither a 'count dim' header nor a vector",
                                 line=line_no, expected=VEC_FORMAT)
            try:
                vec = np.asarray([float(x) for x in parts[1:]], dtype=np.float32)
            except ValueError:
                raise InputError(path, "a non-numeric vector component", line=line_no,
                                 expected="'word v1 ... vd' with numbers") from None
            if not np.isfinite(vec).all():
                raise InputError(path, "a NaN or infinite vector component", line=line_no,
                                 expected="finite numbers (one would make the mean, and every centred "
                                          "cosine, NaN)")
            if dim is None:
                dim = len(vec)
            if len(vec) != dim:
                raise InputError(path, f"{len(vec)} components", line=line_no,
                                 expected=f"{dim} like the others" if rows else f"{dim} as the header says")
            yield parts[0].lower(), vec
            rows += 1
            if rows == limit:
                return
    if not rows:
        raise InputError(path, "no vectors", expected=VEC_FORMAT)


def check_vectors(path: str | Path) -> Path:
    """The vectors file ``WordVectors`` will read, checked in a few lines, without fastText: it is a
    file; a ``.vec`` / ``.txt`` starts with vector lines (``_vec_rows``' rules); any other file starts
    with fastText's magic number. The dry run's check and the run's, before its actors load it."""
    path = _existing_file(path, "similarity.vectors", "a fastText .bin or .vec file")
    if path.suffix in TEXT_SUFFIXES:
        for _ in _vec_rows(path, limit=CHECKED_ROWS):
            pass
        return path
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4 or int.from_bytes(head, "little", signed=True) != FASTTEXT_MAGIC:
        raise InputError(path, "not a fastText model (its first bytes are not fastText's magic number)",
                         expected=f"a fastText .bin written by save_model, or vectors as {VEC_FORMAT} "
                                  f"in a file named {' or '.join(TEXT_SUFFIXES)}")
    return path


def check_corpus(paths: Iterable[str | Path]) -> list[Path]:
    """Every similarity corpus file is text as every other reader takes it (``formats.base.lines``:
    strict UTF-8, binary content refused with file:line) and holds a word (what ``train_vectors``
    trains on). Reads each whole file once; returns the paths."""
    checked = []
    for path in paths:
        path = _existing_file(path, "similarity corpus file", "a plain-text file")
        has_word = False
        for _, text in lines(path):  # every line: binary content past the first word is refused too
            has_word = has_word or _WORD.search(text) is not None
        if not has_word:
            raise InputError(path, "no words (empty, blank or punctuation only)",
                             expected="text to train the similarity vectors on")
        checked.append(path)
    return checked


def check_similarity_inputs(sim: SimilarityConfig) -> None:
    """What the filter's vectors come from: the vectors file when one is given, else every corpus file."""
    if sim.vectors:
        check_vectors(sim.vectors)
    else:
        check_corpus(sim.corpus)


def _existing_file(path: str | Path, what: str, expected: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputError(path, f"{what} not found", expected=expected)
    if not path.is_file():
        raise InputError(path, f"{what} is {'a directory' if path.is_dir() else 'not a regular file'}",
                         expected=expected)
    return path


def vectors_key(cfg: SimilarityConfig, corpus: Iterable[str | Path]) -> str:
    """Cache key: the corpus files' contents, every training setting and the fastText release
    (another build may train other vectors from the same corpus)."""
    settings = {k: getattr(cfg, k) for k in ("dim", "epochs", "lr", "min_count", "minn", "maxn", "bucket")}
    return content_key(settings, [file_sha256(path) for path in corpus], _fasttext_release())


def _fasttext_release() -> str:
    try:
        return importlib.metadata.version("fasttext")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


#: fresh processes a training may take: a NaN can be the process's, not the settings' (below)
NAN_ATTEMPTS = 3


def _fit_skipgram(text: str, out: str, settings: dict) -> int:
    """Train and save in a fresh process: measured here, fastText 0.9.2 trained in a process that had
    already trained once (or written a manifest) gave different vectors and sometimes NaN, while a
    fresh process with thread=1 is bit-for-bit repeatable. Even a fresh process sometimes ends in
    fastText's "Encountered NaN" (0.9.3: the test suite's 15,088-word corpus, every time in one order of
    the tests on one day, never in 60 runs of the same training minutes later; every run that ended
    gave the same bytes), so ``train_vectors`` tries again in another fresh process."""
    import fasttext  # heavy: fasttext

    model = fasttext.train_unsupervised(text, model="skipgram", thread=1, verbose=0, **settings)
    model.save_model(out)
    return len(model.words)


def train_vectors(cfg: SimilarityConfig, corpus: list[Path], cache_dir: Path) -> Path:
    """Skipgram vectors on ``corpus`` (normalised words), cached under ``cache_dir/<key>/``.

    Returns the ``.bin`` path. A cached model is reused when the corpus bytes and settings match.
    """
    corpus = check_corpus(corpus)
    out = Path(cache_dir) / vectors_key(cfg, corpus)
    with output_lock(out):  # two jobs sharing the cache: the second waits, then reuses (both trained them)
        if is_complete(out) and (out / MODEL_FILE).is_file():
            log.info("reusing fastText vectors %s", out / MODEL_FILE)
            return out / MODEL_FILE
        with atomic_dir(out, "similarity") as tmp:
            text = tmp / "corpus.txt"
            words = 0
            with open(text, "w", encoding="utf-8") as w:
                for path in corpus:
                    for _, line in lines(path):
                        tokens = normalise_words(line)
                        if tokens:
                            words += len(tokens)
                            w.write(" ".join(tokens) + "\n")
            min_count = cfg.min_count if words >= 1000 else 1  # a tiny corpus would leave no vocabulary
            log.info("training fastText skipgram (dim %d, %d epochs) on %d words", cfg.dim, cfg.epochs, words)
            settings = {"dim": cfg.dim, "epoch": cfg.epochs, "lr": cfg.lr, "minCount": min_count, "minn": cfg.minn,
                        "maxn": cfg.maxn, "bucket": cfg.bucket}
            for attempt in range(1, NAN_ATTEMPTS + 1):
                try:
                    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                        vocabulary = pool.submit(_fit_skipgram, str(text), str(tmp / MODEL_FILE), settings).result()
                    break
                except RuntimeError as exc:
                    if "NaN" not in str(exc):
                        raise
                    if attempt == NAN_ATTEMPTS:
                        raise OrchestratorError(
                            f"fastText skipgram training diverged (Encountered NaN) in {NAN_ATTEMPTS} fresh processes "
                            f"on {', '.join(map(str, corpus))} ({words} words; lr {cfg.lr:g}, dim {cfg.dim}, "
                            f"{cfg.epochs} epochs): lower similarity.lr (e.g. {cfg.lr / 2:g}), or give "
                            "similarity.corpus more text") from None
                    log.warning("fastText training ended in NaN (attempt %d of %d); again in a fresh process",
                                attempt, NAN_ATTEMPTS)
            text.unlink()
            write_manifest(tmp, stage="similarity", config=cfg, inputs=corpus,
                           counts={"words": words, "vocabulary": vocabulary},
                           extra={"min_count_used": min_count, "attempts": attempt})
        return out / MODEL_FILE

