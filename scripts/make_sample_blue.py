"""Write the synthetic BLUE sample shipped in orchestrator/sample_data/blue/ (deterministic).

    python scripts/make_sample_blue.py [--out orchestrator/sample_data/blue]

Templated biomedical-looking text, NOT real data: a fresh clone has no ../shared and the real
corpora carry data-use agreements. Each task's files use exactly BLUE's official layout
(pandas TSV for BIOSSES, index/sentence/label TSVs for relations, 4-column NER with 'devel',
HoC sentence rows with k_v labels, MedNLI/MedSTS pair TSVs) and carry a lexical signal a small
BERT can learn within a few epochs, so a trained model beats the trivial baseline.
"""
from __future__ import annotations

import argparse
import csv
import io
import random
from pathlib import Path

from orchestrator.core.manifest import atomic_write_text

SIZES = {"train": 120, "dev": 40, "test": 40}
GENES = ["BRCA1", "TP53", "EGFR", "KRAS", "MYC", "PTEN", "VEGFA", "CDK4", "JAK2", "STAT3", "AKT1", "ERBB2"]
DISEASES = ["breast cancer", "asthma", "diabetes", "hepatitis", "glioma", "leukemia", "sepsis", "psoriasis"]
PROCESSES = ["cell proliferation", "apoptosis", "DNA repair", "angiogenesis", "autophagy", "migration"]
CHEMICALS = ["cisplatin", "doxorubicin", "metformin", "tamoxifen", "valproic acid", "lithium carbonate",
             "aspirin", "heparin", "cyclosporine", "sodium chloride", "paclitaxel", "nitric oxide"]
DISORDERS = ["chest pain", "pneumonia", "atrial fibrillation", "renal failure", "hypertension", "anemia",
             "cellulitis", "heart failure", "nausea", "delirium"]
FILLERS = ["in treated patients", "in a murine model", "in cultured cells", "after two weeks",
           "in a cohort study", "at high doses", "in vitro"]


def _tsv(rows: list[list], header: list[str] | None) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------- pairs
def _sts_pair(rng: random.Random) -> tuple[str, str, float]:
    g, d, p = rng.choice(GENES), rng.choice(DISEASES), rng.choice(PROCESSES)
    s1 = f"{g} regulates {p} in {d}."
    level = rng.randrange(5)
    others = lambda xs, x: rng.choice([y for y in xs if y != x])  # noqa: E731
    s2 = [f"{others(GENES, g)} is unrelated to {others(PROCESSES, p)} in {others(DISEASES, d)} {rng.choice(FILLERS)}.",
          f"{others(GENES, g)} affects {others(PROCESSES, p)} in {d}.",
          f"{g} was studied in {others(DISEASES, d)} {rng.choice(FILLERS)}.",
          f"{g} controls {others(PROCESSES, p)} in {d}.",
          f"In {d}, {p} is regulated by {g}."][level]
    score = min(4.0, max(0.0, round(level + rng.uniform(-0.4, 0.4), 1)))
    return s1, s2, score


def biosses(rng: random.Random, split: str, n: int) -> str:
    rows = []
    for i in range(n):
        s1, s2, score = _sts_pair(rng)
        rows.append([i, "GENRE", "BIOSSES", 2019, i, "BIOSSES", "BIOSSES", s1, s2, score])
    return _tsv(rows, ["", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                       "sentence2", "score"])


def medsts(rng: random.Random, split: str, n: int) -> str:
    return _tsv([[f"{split}-{i}", *_sts_pair(rng)] for i in range(n)], ["index", "sentence1", "sentence2", "score"])


def mednli(rng: random.Random, split: str, n: int) -> str:
    rows = []
    for i in range(n):
        cond, other, drug = rng.choice(DISORDERS), rng.choice(DISORDERS), rng.choice(CHEMICALS)
        premise = f"Patient with history of {cond} was started on {drug} {rng.choice(FILLERS)}."
        label = rng.choice(["entailment", "contradiction", "neutral"])
        hypothesis = {"entailment": f"The patient has {cond}.",
                      "contradiction": f"The patient denies any {cond}.",
                      "neutral": f"The patient's mother had {other}."}[label]
        rows.append([f"{split}-{i}", premise, hypothesis, label])
    return _tsv(rows, ["index", "sentence1", "sentence2", "label"])


# ------------------------------------------------------------------------------------ relations
CHEMPROT = {"CPR:3": "increases the expression of", "CPR:4": "inhibits", "CPR:5": "is an agonist of",
            "CPR:6": "antagonizes", "CPR:9": "is metabolized by", "false": "was measured together with"}
DDI = {"DDI-advise": "should not be given with", "DDI-effect": "enhances the sedative effect of",
       "DDI-int": "interacts with", "DDI-mechanism": "raises plasma levels of", "DDI-false": "and"}
I2B2 = {"TrAP": ("@treatment$", "was given for", "@problem$"), "TrCP": ("@treatment$", "caused", "@problem$"),
        "TeRP": ("@test$", "revealed", "@problem$"), "TeCP": ("@test$", "was ordered to evaluate", "@problem$"),
        "PIP": ("@problem$", "with associated", "@problem$"), "TrIP": ("@treatment$", "improved", "@problem$"),
        "TrWP": ("@problem$", "worsened despite", "@treatment$"), "TrNAP": ("@treatment$", "was held due to", "@problem$"),
        "false": ("@treatment$", "and", "@problem$")}


def chemprot(rng: random.Random, split: str, n: int) -> str:
    rows = []
    for i in range(n):
        label = "false" if rng.random() < 0.35 else rng.choice(list(CHEMPROT)[:5])
        if rng.random() < 0.1:  # overlapping entities are one @CHEM-GENE$ marker in BLUE
            text, label = f"@CHEM-GENE$ levels were measured {rng.choice(FILLERS)}.", "false"
        else:
            text = f"@CHEMICAL$ {CHEMPROT[label]} @GENE$ {rng.choice(FILLERS)}."
        rows.append([f"{1000 + i // 3}.T{i}.T{i + 500}", text, label])
    return _tsv(rows, ["index", "sentence", "label"])


def ddi(rng: random.Random, split: str, n: int) -> str:
    rows = []
    for i in range(n):
        label = "DDI-false" if rng.random() < 0.4 else rng.choice(list(DDI)[:4])
        rows.append([f"DDI-DrugBank.d{i // 4}.s{i % 4}.p0", f"@DRUG$ {DDI[label]} @DRUG$ {rng.choice(FILLERS)}.",
                     label])
    return _tsv(rows, ["index", "sentence", "label"])


def i2b2(rng: random.Random, split: str, n: int) -> str:
    rows = []
    for i in range(n):
        label = "false" if rng.random() < 0.3 else rng.choice(list(I2B2)[:8])
        a, verb, b = I2B2[label]
        rows.append([f"record-{i // 5}.con{i}.con{i + 1}", f"{a} {verb} {b} {rng.choice(FILLERS)}.", label])
    return _tsv(rows, ["index", "sentence", "label"])


# ------------------------------------------------------------------------------------------ NER
def _ner(rng: random.Random, split: str, n: int, names: list[str], verbs: list[str]) -> str:
    """BLUE 4-column NER: token, docid on a sentence's first token else '-', offset, B/I/O."""
    lines = []
    for i in range(n):
        mention = rng.choice(names).split()
        left = rng.choice(["Treatment with", "Exposure to", "The patient reported", "We observed"]).split()
        right = (rng.choice(verbs) + " " + rng.choice(FILLERS) + " .").split()
        tokens = left + mention + right
        tags = ["O"] * len(left) + ["B"] + ["I"] * (len(mention) - 1) + ["O"] * len(right)
        offset = 0
        for j, (tok, tag) in enumerate(zip(tokens, tags)):
            lines.append(f"{tok}\t{f'{split}{i:04d}' if j == 0 else '-'}\t{offset}\t{tag}")
            offset += len(tok) + 1
        lines.append("")
    return "\n".join(lines) + "\n"


def bc5cdr_chem(rng, split, n):
    return _ner(rng, split, n, CHEMICALS, ["was well tolerated", "reduced symptoms", "was discontinued"])


def bc5cdr_disease(rng, split, n):
    return _ner(rng, split, n, DISEASES, ["was diagnosed", "progressed slowly", "was confirmed"])


def shareclefe(rng, split, n):
    return _ner(rng, split, n, DISORDERS, ["was noted on admission", "resolved", "was documented"])


# ------------------------------------------------------------------------------------------ HoC
HALLMARKS = ["invasion and metastasis", "immune evasion", "aerobic glycolysis", "telomerase activation",
             "loss of growth suppressors", "genomic instability", "tumour angiogenesis", "resistance to apoptosis",
             "sustained proliferative signalling", "tumour-promoting inflammation"]


def hoc(rng: random.Random, split: str, n_rows: int) -> str:
    """One row per sentence; labels as BLUE's k_v cells; index PMID_s<n>. Most sentences state a
    hallmark (each hallmark twice per document, in its own words): with ten sigmoid outputs, a
    rarer cue leaves a small model predicting no label at all for many epochs."""
    rows = []
    doc = 0
    while len(rows) < n_rows:
        pmid = 20000000 + doc + {"train": 0, "dev": 10000, "test": 20000}[split]
        chosen = rng.sample(range(len(HALLMARKS)), rng.choice([2, 3]))
        sentences = [(f"{rng.choice(GENES)} was examined in {rng.choice(DISEASES)} samples.", set())]
        for k in chosen:
            sentences.append((f"{rng.choice(GENES)} drives {HALLMARKS[k]} {rng.choice(FILLERS)}.", {k}))
            sentences.append((f"Markers of {HALLMARKS[k]} rose {rng.choice(FILLERS)}.", {k}))
        pair = rng.sample(chosen, 2) if len(chosen) > 1 else chosen
        sentences.append((f"Both {' and '.join(HALLMARKS[k] for k in pair)} were seen.", set(pair)))
        for s, (text, ks) in enumerate(sentences):
            cells = ",".join(f"{k}_{int(k in ks)}" for k in range(len(HALLMARKS)))
            rows.append([cells, text, f"{pmid}_s{s}"])
        doc += 1
    return _tsv(rows, ["labels", "sentence", "index"])


TASKS = {"BIOSSES": biosses, "MedSTS": medsts, "MedNLI": mednli, "ChemProt": chemprot, "DDI": ddi,
         "i2b2-2010": i2b2, "BC5CDR-chem": bc5cdr_chem, "BC5CDR-disease": bc5cdr_disease,
         "ShAReCLEFE": shareclefe, "HoC": hoc}
NER_DIRS = {"BC5CDR-chem", "BC5CDR-disease", "ShAReCLEFE"}


def write_samples(out: Path, seed: int = 13) -> list[Path]:
    written = []
    for t, (task, make) in enumerate(sorted(TASKS.items())):
        for s, (split, n) in enumerate(SIZES.items()):
            rng = random.Random(seed * 1000 + t * 10 + s)
            name = "devel" if split == "dev" and task in NER_DIRS else split
            written.append(atomic_write_text(out / task / f"{name}.tsv", make(rng, split, n)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "orchestrator" / "sample_data" / "blue")
    args = parser.parse_args(argv)
    for path in write_samples(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
