"""Examples of a task from BLUE's official files and from any TSV / CoNLL / JSONL dataset declared in YAML.

The file layouts are read by ``orchestrator.formats`` (``TaskSpec.format`` names the reader,
``columns`` / ``positions`` / ``quoting`` its layout); this module gives the rows their task
meaning: labels checked against the task's label set, STS scores finite and inside the task's
``score_range``, HoC's ``k_v`` cells, BLUE's bare B/I tags typed. Malformed input raises
``InputError`` naming the file, the 1-based line and what was expected, never a bare KeyError
or IndexError deep in training.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.core.errors import InputError
from orchestrator.finetune.spec import TaskSpec
from orchestrator.formats import Layout, Sentence, read

CV_SPLIT_SEED = 0  # folds and dev carve-outs are the same for every seed and learning rate

_KV_CELL = re.compile(r"^(\d+)_([01])$")


@dataclasses.dataclass(frozen=True)
class Example:
    """One model input. ``text_a`` is a token list for NER, else a string; ``label`` is a float
    (sts), a label string (re, nli, doccls), a tag list (ner) or a tuple of label indices
    (multilabel); ``doc`` groups multilabel sentences into documents."""

    id: str
    text_a: Any
    label: Any
    text_b: str | None = None
    doc: str | None = None
    line: int = 0


def read_split(spec: TaskSpec, data_root: str | Path, split: str) -> list[Example]:
    """Read one split of a task from ``data_root/<spec.dir>/<spec.files[split]>``."""
    path = spec.split_path(Path(data_root), split)
    return read_file(spec, path)


#: TaskSpec.format -> the ``orchestrator.formats`` reader of that file layout.
READER_OF = {"tsv": "blue_tsv", "blue_ner": "blue_ner", "iob": "iob", "conll": "conll", "jsonl": "jsonl",
             "i2b2_deid": "i2b2_deid"}
#: Formats whose records are tagged word sequences (sentences; an i2b2 note).
TOKEN_FORMATS = ("blue_ner", "iob", "conll", "i2b2_deid")
#: Formats whose split is a directory of files (sorted by name), one document each.
DIRECTORY_FORMATS = {"i2b2_deid": "*.xml"}


def read_file(spec: TaskSpec, path: str | Path) -> list[Example]:
    """The examples of one split file (for a directory format: of every file in the directory)."""
    path = Path(path)
    pattern = DIRECTORY_FORMATS.get(spec.format)
    if pattern:
        files = sorted(path.glob(pattern)) if path.is_dir() else []
        if not files:
            raise InputError(path, f"no {pattern} files for task {spec.name}",
                             expected=f"a directory of {spec.format} files, one note each")
    elif not path.is_file():
        raise InputError(path, f"file not found for task {spec.name}", expected=f"a {spec.format} file")
    else:
        files = [path]
    layout = Layout(columns=spec.columns, positions=spec.positions, index_role="id", quoting=spec.quoting,
                    text_field="")
    examples = []
    for file in files:
        records = read(file, READER_OF[spec.format], layout)
        if spec.format in TOKEN_FORMATS:
            examples += [piece for sentence in records
                         for piece in chunk_words(_token_example(spec, file, sentence), spec.chunk_words)]
        else:
            examples += [_make_example(spec, file, row.line, row.fields) for row in records]
    if not examples:
        raise InputError(path, "no examples", expected=f"at least one {spec.family} example")
    return examples


def chunk_words(example: Example, size: int) -> list[Example]:
    """An NER example cut into consecutive pieces of at most ``size`` words (seed 001: a note of 700
    words gives 250, 250 and 200), ids suffixed ``#<piece>``; 0 or a short example: itself."""
    words = example.text_a
    if not size or len(words) <= size:
        return [example]
    return [dataclasses.replace(example, id=f"{example.id}#{k}", text_a=words[i:i + size],
                                label=example.label[i:i + size])
            for k, i in enumerate(range(0, len(words), size))]


def _make_example(spec: TaskSpec, path: Path, line: int, row: Mapping[str, Any]) -> Example:
    text_a = _text(spec, path, line, row, "text_a", "sentence")
    text_b = _text(spec, path, line, row, "text_b", "second sentence") if "text_b" in row else None
    raw_id = row.get("id", line)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise _field_error(spec, path, line, "id", raw_id, "a string or an integer id")
    ex_id = str(raw_id)
    label = _parse_label(spec, path, line, row.get("label"))
    doc = None
    if spec.family == "multilabel":
        sep = spec.group_separator
        doc = ex_id.split(sep, 1)[0] if sep and sep in ex_id else ex_id
    return Example(id=ex_id, text_a=text_a, text_b=text_b, label=label, doc=doc, line=line)


def _text(spec: TaskSpec, path: Path, line: int, row: Mapping[str, Any], role: str, what: str) -> str:
    """The stripped text of ``role``: a JSON null, list, object, number or bool is refused, never
    turned into the words "None" or "True" (TSV cells are always strings)."""
    raw = row.get(role, "")
    if not isinstance(raw, str):
        raise _field_error(spec, path, line, role, raw, "a non-empty string")
    if not raw.strip():
        raise InputError(path, f"empty {what}", line=line, expected="a non-empty text")
    return raw.strip()


def _field_error(spec: TaskSpec, path: Path, line: int, role: str, raw: Any, expected: str) -> InputError:
    """``field 'premise' is null``: the file's name of the role's field and the JSON kind of its value."""
    if raw is None:
        kind = "null"
    elif isinstance(raw, bool):
        kind = f"a boolean ({str(raw).lower()})"
    elif isinstance(raw, (int, float)):
        kind = f"a number ({raw!r})"
    elif isinstance(raw, list):
        kind = "a list"
    elif isinstance(raw, dict):
        kind = "an object"
    else:
        kind = f"a {type(raw).__name__}"
    return InputError(path, f"field {spec.columns.get(role, role)!r} is {kind}", line=line, expected=expected)


def _parse_label(spec: TaskSpec, path: Path, line: int, raw: Any) -> Any:
    if spec.family == "sts":
        return _parse_score(spec, path, line, raw)
    if spec.family == "multilabel":
        return _parse_multilabel(spec, path, line, raw)
    expected = f"one of {list(spec.labels)}"
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):  # JSON labels may be numbers
        raise _field_error(spec, path, line, "label", raw, expected)
    label = str(raw).strip()
    if label not in spec.labels:
        raise InputError(path, f"unknown label {label!r}", line=line, expected=expected)
    return label


def _parse_score(spec: TaskSpec, path: Path, line: int, raw: Any) -> float:
    """A finite similarity score, inside the task's ``score_range`` when it declares one."""
    expected = "a similarity score" if spec.score_range is None else \
        f"a similarity score in [{spec.score_range[0]:g}, {spec.score_range[1]:g}]"
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):  # float(True) would be 1.0
        raise _field_error(spec, path, line, "label", raw, expected)
    try:
        score = float(raw)
    except ValueError:
        raise InputError(path, f"score {raw!r} is not a number", line=line, expected=expected) from None
    if not math.isfinite(score):
        raise InputError(path, f"score {raw!r} is not a finite number", line=line, expected=expected)
    if spec.score_range is not None and not spec.score_range[0] <= score <= spec.score_range[1]:
        raise InputError(path, f"score {raw!r} is out of range", line=line, expected=expected)
    return score


def _parse_multilabel(spec: TaskSpec, path: Path, line: int, raw: Any) -> tuple[int, ...]:
    """BLUE HoC cells: one 'k_v' pair for each label ('0_0,1_1,...', k indexes labels, in any order),
    or label names; empty = none. A pair missing or given twice is refused: '0_0,1_0,0_1' would
    otherwise say label 0 is present and labels 2-9 absent."""
    if raw is not None and not isinstance(raw, str):
        raise _field_error(spec, path, line, "label", raw, "a string of k_v pairs or label names")
    text = "" if raw is None else raw.strip()
    if not text or text.lower() == "nan":
        return ()
    items = [x.strip() for x in text.split(",") if x.strip()]
    found: set[int] = set()
    pairs: dict[int, list[str]] = {}
    for item in items:
        kv = _KV_CELL.match(item)
        if kv:
            k = int(kv.group(1))
            if k >= len(spec.labels):
                raise InputError(path, f"label index {k} in {item!r}", line=line,
                                 expected=f"k < {len(spec.labels)} in k_v cells")
            pairs.setdefault(k, []).append(item)
            if kv.group(2) == "1":
                found.add(k)
        elif item in spec.labels:
            found.add(spec.labels.index(item))
        else:
            raise InputError(path, f"unknown label {item!r}", line=line,
                             expected=f"k_v pairs or names from {list(spec.labels)}")
    if not pairs:
        return tuple(sorted(found))
    n = len(spec.labels)
    expected = f"one k_v pair for each of the {n} labels"
    count = sum(map(len, pairs.values()))
    if count != len(items):
        raise InputError(path, "label cell mixes k_v pairs and label names", line=line, expected=expected)
    if count != n or len(pairs) != n:
        problems = [f"label {k} given {len(given)} times ({', '.join(given)})"
                    for k, given in sorted(pairs.items()) if len(given) > 1]
        missing = [k for k in range(n) if k not in pairs]
        if missing:
            problems.append(f"no pair for label{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")
        raise InputError(path, f"label cell has {count} k_v pairs; {'; '.join(problems)}", line=line,
                         expected=expected)
    return tuple(sorted(found))


# ------------------------------------------------------------------------------------ token files
def _token_example(spec: TaskSpec, path: Path, sentence: Sentence) -> Example:
    """One NER sentence; BLUE's bare B/I tags get the task's entity type, every tag must be a label."""
    tags = [_normalise_tag(spec, tag) for tag in sentence.tags]
    for tag, raw, line in zip(tags, sentence.tags, sentence.lines):
        if tag not in spec.labels:
            raise InputError(path, f"unknown tag {raw!r}", line=line, expected=f"one of {list(spec.labels)}")
    return Example(id=f"{sentence.doc or path.stem}:{sentence.line}", text_a=list(sentence.tokens), label=tags,
                   doc=sentence.doc or None, line=sentence.line)


def _normalise_tag(spec: TaskSpec, tag: str) -> str:
    """BLUE's 4-column files carry bare B/I/O: give B and I the task's entity type."""
    if tag in ("B", "I") and spec.entity_type:
        return f"{tag}-{spec.entity_type}"
    return tag


def fixed_subset(examples: list[Example], n: int, by_document: bool = False) -> list[Example]:
    """A fixed (seed-independent) subsample, so every trial of a sweep sees the same data. ``by_document``: whole
    documents (``Example.doc``, else the example alone) drawn in a fixed order until they hold ``n`` examples, for
    a metric that scores documents: a sample of HoC's sentences scored fragments of documents, and a perfect
    model 37.8 on test (probe B1). Examples keep their file order."""
    if not n or len(examples) <= n:
        return examples
    if not by_document:
        keep = sorted(random.Random(0).sample(range(len(examples)), n))
        return [examples[i] for i in keep]
    members: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        members.setdefault(ex.doc or ex.id, []).append(i)
    docs = list(members)
    random.Random(0).shuffle(docs)
    keep = []
    for doc in docs:
        keep += members[doc]
        if len(keep) >= n:
            break
    return [examples[i] for i in sorted(keep)]


def document_split(examples: list[Example], shares: Mapping[str, float], separator: str,
                   seed: int) -> dict[str, list[Example]]:
    """Split examples by document (``doc``, else the id up to ``separator``): documents are shuffled
    with ``seed`` and cut in ``shares`` order by count, so no document crosses splits and the split
    does not depend on the trial. Examples keep their file order within a split."""
    def doc_of(ex: Example) -> str:
        return ex.doc or (ex.id.split(separator, 1)[0] if separator and separator in ex.id else ex.id)

    docs = sorted({doc_of(ex) for ex in examples})
    random.Random(seed).shuffle(docs)
    where, start, total = {}, 0, 0.0
    for i, (split, share) in enumerate(shares.items()):
        total += share
        end = len(docs) if i == len(shares) - 1 else round(total * len(docs))
        where.update(dict.fromkeys(docs[start:end], split))
        start = end
    out = {split: [] for split in shares}
    for ex in examples:
        out[where[doc_of(ex)]].append(ex)
    return out


# --------------------------------------------------------------------------------- cross-validation
def stratified_folds(examples: list[Example], k: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(train indices, test indices) per fold, stratified by label (seed 000's DocClsJp protocol)."""
    from sklearn.model_selection import StratifiedKFold  # heavy: sklearn

    labels = [ex.label for ex in examples]
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(list(tr), list(te)) for tr, te in splitter.split(list(range(len(labels))), labels)]
