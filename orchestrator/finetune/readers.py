"""Readers for BLUE's official files and for any TSV / CoNLL / JSONL dataset declared in YAML.

Every reader returns a list of ``Example``; malformed input raises ``InputError`` naming the
file, the 1-based line and what was expected, never a bare KeyError deep in training.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.core.errors import InputError
from orchestrator.finetune.spec import TaskSpec

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


def read_file(spec: TaskSpec, path: str | Path) -> list[Example]:
    path = Path(path)
    if not path.is_file():
        raise InputError(path, f"file not found for task {spec.name}", expected=f"a {spec.format} file")
    if spec.format in ("blue_ner", "iob", "conll"):
        examples = _read_token_file(spec, path)
    elif spec.format == "jsonl":
        examples = [_make_example(spec, path, line, row) for line, row in _jsonl_rows(path)]
    else:
        examples = [_make_example(spec, path, line, row) for line, row in _tsv_rows(spec, path)]
    if not examples:
        raise InputError(path, "no examples", expected=f"at least one {spec.family} example")
    return examples


# --------------------------------------------------------------------------------------------- TSV
def _tsv_rows(spec: TaskSpec, path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows as {role: cell}: by header name when the first line is a header, else by position.

    csv.reader, not str.split: BLUE's pandas-written files quote cells holding a TAB.
    """
    quoting = csv.QUOTE_NONE if spec.quoting == "none" else csv.QUOTE_MINIMAL
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=quoting)
        rows = [(reader.line_num, cells) for cells in reader]
    rows = [(line, cells) for line, cells in rows if cells and any(c.strip() for c in cells)]
    if not rows:
        return
    wanted = {role: col for role, col in spec.columns.items()}
    header = [h.strip() for h in rows[0][1]]
    required = {role: col for role, col in wanted.items() if role != "id"}
    if required and all(c in header for c in required.values()):
        index = {role: header.index(col) for role, col in wanted.items() if col in header}
        if "id" not in index and header[0] == "":  # pandas' unnamed index column (BLUE's BIOSSES)
            index["id"] = 0
        rows = rows[1:]
    elif spec.positions and not any(c in header for c in required.values()):
        index = dict(spec.positions)
    else:
        missing = [c for c in required.values() if c not in header]
        raise InputError(path, f"header lacks columns {missing}", line=rows[0][0],
                         expected=f"a TAB-separated header naming {list(wanted.values())}")
    width = len(header)
    for line, cells in rows:
        if len(cells) != width:
            raise InputError(path, f"{len(cells)} TAB-separated columns", line=line,
                             expected=f"{width} columns like the first line")
        yield line, {role: cells[i].strip() for role, i in index.items()}


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(path, f"invalid JSON: {exc.msg}", line=line_no,
                                 expected="one JSON object per line") from None
            if not isinstance(obj, dict):
                raise InputError(path, "not a JSON object", line=line_no, expected="one JSON object per line")
            yield line_no, obj


def _make_example(spec: TaskSpec, path: Path, line: int, row: dict) -> Example:
    if spec.format == "jsonl":
        missing = [key for role, key in spec.columns.items() if key not in row]
        if missing:
            raise InputError(path, f"missing keys {missing}", line=line, expected=f"keys {list(spec.columns.values())}")
        row = {role: row[key] for role, key in spec.columns.items()}
    text_a = str(row.get("text_a", "")).strip()
    if not text_a:
        raise InputError(path, "empty sentence", line=line, expected="a non-empty text")
    text_b = row.get("text_b")
    if "text_b" in row and not str(text_b).strip():
        raise InputError(path, "empty second sentence", line=line, expected="a non-empty text")
    ex_id = str(row.get("id", line))
    label = _parse_label(spec, path, line, row.get("label"))
    doc = None
    if spec.family == "multilabel":
        sep = spec.group_separator
        doc = ex_id.split(sep, 1)[0] if sep and sep in ex_id else ex_id
    return Example(id=ex_id, text_a=text_a, text_b=None if text_b is None else str(text_b).strip(),
                   label=label, doc=doc, line=line)


def _parse_label(spec: TaskSpec, path: Path, line: int, raw: Any) -> Any:
    if spec.family == "sts":
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise InputError(path, f"score {raw!r} is not a number", line=line,
                             expected="a similarity score") from None
    if spec.family == "multilabel":
        return _parse_multilabel(spec, path, line, raw)
    label = str(raw).strip() if raw is not None else ""
    if label not in spec.labels:
        raise InputError(path, f"unknown label {label!r}", line=line, expected=f"one of {list(spec.labels)}")
    return label


def _parse_multilabel(spec: TaskSpec, path: Path, line: int, raw: Any) -> tuple[int, ...]:
    """BLUE HoC cells: 'k_v' pairs ('0_0,1_1,...', k indexes labels) or label names; empty = none."""
    text = "" if raw is None else str(raw).strip()
    if not text or text.lower() == "nan":
        return ()
    items = [x.strip() for x in text.split(",") if x.strip()]
    found: set[int] = set()
    for item in items:
        kv = _KV_CELL.match(item)
        if kv:
            k = int(kv.group(1))
            if k >= len(spec.labels):
                raise InputError(path, f"label index {k} in {item!r}", line=line,
                                 expected=f"k < {len(spec.labels)} in k_v cells")
            if kv.group(2) == "1":
                found.add(k)
        elif item in spec.labels:
            found.add(spec.labels.index(item))
        else:
            raise InputError(path, f"unknown label {item!r}", line=line,
                             expected=f"k_v pairs or names from {list(spec.labels)}")
    return tuple(sorted(found))


# ------------------------------------------------------------------------------------ token files
def _read_token_file(spec: TaskSpec, path: Path) -> list[Example]:
    """BLUE 4-column (token, docid or '-', offset, B/I/O), 2-column IOB, or CoNLL columns;
    one token per line, a blank line between sentences."""
    width = {"blue_ner": 4, "iob": 2}.get(spec.format)
    tok_i = spec.positions.get("token", 0)
    lab_i = spec.positions.get("label", -1)
    examples: list[Example] = []
    tokens: list[str] = []
    tags: list[str] = []
    start_line = 0
    doc = None

    def flush() -> None:
        nonlocal tokens, tags, doc
        if tokens:
            examples.append(Example(id=f"{doc or path.stem}:{start_line}", text_a=tokens, label=tags,
                                    doc=doc, line=start_line))
        tokens, tags, doc = [], [], None

    with open(path, encoding="utf-8", newline="") as f:
        for line_no, raw in enumerate(f, 1):
            text = raw.rstrip("\r\n")
            if not text.strip():
                flush()
                continue
            if text.startswith("-DOCSTART-"):
                flush()
                continue
            cells = text.split("\t") if spec.format != "conll" or "\t" in text else text.split()
            if width is not None and len(cells) != width:
                raise InputError(path, f"{len(cells)} TAB-separated columns", line=line_no,
                                 expected=f"{width} columns ({_TOKEN_LAYOUT[spec.format]})")
            if len(cells) < 2:
                raise InputError(path, "a token without a tag", line=line_no, expected="token and tag columns")
            token, tag = cells[tok_i].strip(), cells[lab_i].strip()
            if not token:
                raise InputError(path, "empty token", line=line_no, expected="a non-empty token")
            tag = _normalise_tag(spec, tag)
            if tag not in spec.labels:
                raise InputError(path, f"unknown tag {cells[lab_i]!r}", line=line_no,
                                 expected=f"one of {list(spec.labels)}")
            if not tokens:
                start_line = line_no
                if spec.format == "blue_ner" and cells[1] != "-":
                    doc = cells[1]
            tokens.append(token)
            tags.append(tag)
    flush()
    return examples


_TOKEN_LAYOUT = {"blue_ner": "token, docid or -, offset, B/I/O", "iob": "token, tag"}


def _normalise_tag(spec: TaskSpec, tag: str) -> str:
    """BLUE's 4-column files carry bare B/I/O: give B and I the task's entity type."""
    if tag in ("B", "I") and spec.entity_type:
        return f"{tag}-{spec.entity_type}"
    return tag


def fixed_subset(examples: list[Example], n: int) -> list[Example]:
    """A fixed (seed-independent) subsample, so every trial of a sweep sees the same data."""
    if not n or len(examples) <= n:
        return examples
    keep = sorted(random.Random(0).sample(range(len(examples)), n))
    return [examples[i] for i in keep]


# --------------------------------------------------------------------------------- cross-validation
def stratified_folds(examples: list[Example], k: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(train indices, test indices) per fold, stratified by label (seed 000's DocClsJp protocol)."""
    from sklearn.model_selection import StratifiedKFold  # heavy: sklearn

    labels = [ex.label for ex in examples]
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(list(tr), list(te)) for tr, te in splitter.split(list(range(len(labels))), labels)]
