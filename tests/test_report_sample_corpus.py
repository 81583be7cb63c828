"""The shipped corpus sample: reproducible from its generator, one document per line, learnable."""
from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "orchestrator" / "sample_data" / "corpus"


def sentences(doc: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", doc) if s]


def words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9+-]{4,}", text.lower()))


def test_generator_reproduces_shipped_files(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_sample_corpus.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    for name in ("in_domain.txt", "general.txt"):
        assert (tmp_path / name).read_bytes() == (SHIPPED / name).read_bytes(), f"{name} is stale: rerun the script"


def test_shape_one_document_per_line():
    for name, low, high in (("in_domain.txt", 90_000, 130_000), ("general.txt", 270_000, 360_000)):
        data = (SHIPPED / name).read_bytes()
        assert low <= len(data) <= high
        text = data.decode("utf-8")
        lines = text.splitlines()
        assert "\r" not in text and text.endswith("\n")
        assert all(line.strip() == line and line for line in lines)  # no blank or padded lines
        assert all(len(sentences(line)) >= 5 for line in lines)  # enough sentences per document for NSP
        assert len(set(lines)) == len(lines)  # no duplicate documents


def test_next_sentences_share_more_than_random_ones():
    """The NSP signal: a real next sentence shares the document's specific words (names, entities)
    with the text before it far more often than a sentence from a random document does."""
    rng = random.Random(0)
    for name in ("in_domain.txt", "general.txt"):
        docs = [sentences(line) for line in (SHIPPED / name).read_text().splitlines()]
        df: dict[str, int] = {}
        for doc in docs:
            for w in words(" ".join(doc)):
                df[w] = df.get(w, 0) + 1
        common = {w for w, n in df.items() if n > 0.1 * len(docs)}  # template words say nothing

        def specific(text: str, common: set[str] = common) -> set[str]:
            return words(text) - common

        real = rand = pairs = 0
        for i, doc in enumerate(docs):
            for k in range(1, len(doc)):
                before = specific(" ".join(doc[:k]))
                other = docs[(i + rng.randint(1, len(docs) - 1)) % len(docs)]
                real += bool(before & specific(doc[k]))
                rand += bool(before & specific(rng.choice(other)))
                pairs += 1
        assert real / pairs > 0.5 and real > 2 * rand, (name, real / pairs, rand / pairs)


def test_vocabulary_is_varied():
    in_domain = (SHIPPED / "in_domain.txt").read_text().split()
    general = (SHIPPED / "general.txt").read_text().split()
    assert len(set(in_domain)) > 800 and len(set(general)) > 700
    drugs = {w.strip(".,();").lower() for w in in_domain if re.search(r"(tinib|mab|vir|gliflozin|statin)\W*$", w)}
    assert len(drugs) > 30  # invented drug names sharing pharmacological suffixes: domain subwords for WordPiece
