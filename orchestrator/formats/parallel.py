"""Parallel text: the same units (sentences, paragraphs, questions) in several languages, aligned.

    units = read_parallel("xquad.de.json")                       # SQuAD JSON: one unit per paragraph
    sides = align({"en": ("xquad.en.json", en), "de": ("xquad.de.json", de)})   # {lang: [Unit]}, one order
    src, tgt = read_tsv_pairs("pairs.tsv")                        # two columns: a unit and its translation

Three layouts:

- **SQuAD JSON** (``squad``; XQuAD, MLQA, JSQuAD): ``{"data": [{"paragraphs": [{"context": ..., "qas":
  [{"id": ..., "question": ...}]}]}]}``. A unit is a paragraph's ``context`` (``unit="context"``) or a
  question (``unit="question"``). Translations of one SQuAD file keep its question ids, so a
  paragraph's key is the ids of its questions and a question's key its id: files are aligned by
  key, whatever their order (a paragraph without questions is keyed by its position,
  ``data[i].paragraphs[j]``);
- **aligned line files** (``lines``): one unit per line, line *n* of every file a translation of line
  *n* of the others (WMT test sets, Tatoeba). Blank lines inside a file are an error (they would
  silently shift the alignment); blank lines at its end are ignored;
- **TSV pairs**: one pair per line, ``unit<TAB>translation``, no header, no quoting.

Every unit is stripped of surrounding white space and of a byte-order mark (XQuAD's Spanish and
Russian contexts start with one). Bad input is an ``InputError`` naming the file, the line (or the
JSON path) and what was expected; two files that are not translations of each other are an
``InputError`` naming both and the first unit that does not match.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from orchestrator.core.errors import InputError
from orchestrator.formats.base import lines

FORMATS = ("auto", "squad", "lines")
SQUAD_UNITS = ("context", "question")
SQUAD_EXPECTED = '{"data": [{"paragraphs": [{"context": "...", "qas": [{"id": "...", "question": "..."}]}]}]}'
BOM = "\ufeff"


@dataclasses.dataclass(frozen=True)
class Unit:
    """One unit of parallel text: ``key`` aligns it with its translations, ``where`` names it in errors."""

    key: str
    text: str
    where: str
    title: str = ""  # SQuAD JSON: the article's title ("" elsewhere)


def clean(text: str) -> str:
    return text.strip().lstrip(BOM).strip()


def detect_format(path: str | Path) -> Literal["squad", "lines"]:
    """``squad`` for a ``.json`` file, ``lines`` for anything else."""
    return "squad" if Path(path).suffix.lower() == ".json" else "lines"


def read_parallel(path: str | Path, fmt: str = "auto", unit: str = "context") -> list[Unit]:
    """The units of one file of a parallel set (``FORMATS``; ``unit`` for SQuAD JSON)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown parallel text format {fmt!r}; one of {FORMATS}")
    if not path.is_file():
        raise InputError(path, "is a directory, not a file" if path.is_dir() else "file not found",
                         expected="a parallel text file (SQuAD JSON or one unit per line)")
    fmt = detect_format(path) if fmt == "auto" else fmt
    units = read_squad(path, unit) if fmt == "squad" else read_lines(path)
    if not units:
        raise InputError(path, "holds no text", expected="at least one unit of parallel text")
    return units


def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(path, f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {column}", line=line,
                         expected="UTF-8 text") from None


def read_squad(path: str | Path, unit: str = "context") -> list[Unit]:
    """Paragraph contexts (``unit="context"``) or questions (``"question"``) of a SQuAD v1.1/v2 JSON file."""
    if unit not in SQUAD_UNITS:
        raise ValueError(f"unknown SQuAD unit {unit!r}; one of {SQUAD_UNITS}")
    path = Path(path)
    try:
        doc = json.loads(_decode(path))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno,
                         expected="SQuAD JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise InputError(path, "not SQuAD JSON: no top-level 'data' list", expected=SQUAD_EXPECTED)
    units: list[Unit] = []
    for i, article in enumerate(data):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise InputError(path, f"data[{i}] has no 'paragraphs' list", expected=SQUAD_EXPECTED)
        title = article.get("title")
        title = clean(title) if isinstance(title, str) else ""
        for j, para in enumerate(paragraphs):
            where = f"{path} data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise InputError(path, f"data[{i}].paragraphs[{j}] has no 'context' string", expected=SQUAD_EXPECTED)
            qas = para.get("qas", [])
            if not isinstance(qas, list) or not all(isinstance(q, dict) for q in qas):
                raise InputError(path, f"data[{i}].paragraphs[{j}].qas is not a list of objects",
                                 expected=SQUAD_EXPECTED)
            ids = []
            for n, qa in enumerate(qas):
                if "id" not in qa:
                    raise InputError(path, f"data[{i}].paragraphs[{j}].qas[{n}] has no 'id'", expected=SQUAD_EXPECTED)
                ids.append(str(qa["id"]))
                if unit == "question":
                    text = qa.get("question")
                    if not isinstance(text, str) or not clean(text):
                        raise InputError(path, f"data[{i}].paragraphs[{j}].qas[{n}] (id {qa['id']}) has no question "
                                               "text", expected=SQUAD_EXPECTED)
                    units.append(Unit(str(qa["id"]), clean(text), f"{where}.qas[{n}]", title))
            if unit == "context":
                text = clean(para["context"])
                if not text:
                    raise InputError(path, f"data[{i}].paragraphs[{j}].context is empty", expected="paragraph text")
                key = "qas:" + ",".join(sorted(ids)) if ids else f"data[{i}].paragraphs[{j}]"
                units.append(Unit(key, text, where, title))
    return units


def read_lines(path: str | Path) -> list[Unit]:
    """One unit per line, keyed by its position; a blank line before the last text line is an error."""
    path = Path(path)
    units: list[Unit] = []
    blank = None  # the first blank line since the last text line
    for number, text in lines(path):
        if not text.strip():
            blank = blank or number
            continue
        if blank is not None:
            raise InputError(path, "blank line inside an aligned file", line=blank,
                             expected="one unit per line: a blank line would shift every later line's translation")
        units.append(Unit(f"#{len(units) + 1}", clean(text), f"{path}:{number}"))
    return units


def read_tsv_pairs(path: str | Path) -> tuple[list[Unit], list[Unit]]:
    """The two sides of a TSV of translation pairs (``unit<TAB>translation`` per line, no header)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "is a directory, not a file" if path.is_dir() else "file not found",
                         expected="a TSV of translation pairs")
    left: list[Unit] = []
    right: list[Unit] = []
    for number, text in lines(path):
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != 2:
            raise InputError(path, f"{len(fields)} tab-separated field(s)", line=number,
                             expected="two: a unit and its translation")
        a, b = clean(fields[0]), clean(fields[1])
        if not a or not b:
            raise InputError(path, f"the {'first' if not a else 'second'} field is empty", line=number,
                             expected="text on both sides of the tab")
        key = f"#{len(left) + 1}"
        left.append(Unit(key, a, f"{path}:{number}"))
        right.append(Unit(key, b, f"{path}:{number}"))
    if not left:
        raise InputError(path, "holds no pairs", expected="lines of unit<TAB>translation")
    return left, right


def align(sides: Mapping[str, tuple[str | Path, Sequence[Unit]]]) -> dict[str, list[Unit]]:
    """Every side in the first side's order, matched by key; raises when the files are not parallel.

    ``sides``: language -> (file, its units). Keys must be unique within a file and every file must
    hold the same keys: a unit missing from one file, or one it has in excess, is named."""
    if not sides:
        return {}
    (ref_lang, (ref_path, ref_units)), *others = sides.items()
    for path, units in sides.values():
        seen: dict[str, Unit] = {}
        for u in units:
            if u.key in seen:
                raise InputError(path, f"{u.where} repeats the unit of {seen[u.key].where} (key {u.key})",
                                 expected="each unit once per file")
            seen[u.key] = u
    out = {ref_lang: list(ref_units)}
    for lang, (path, units) in others:
        by_key = {u.key: u for u in units}
        if len(units) != len(ref_units):
            what = "paragraphs or questions" if any(u.key.startswith(("qas:", "data[")) for u in units) else "lines"
            detail = _first_difference(ref_units, units, by_key)
            raise InputError(path, f"{len(units)} units, but {ref_path} ({ref_lang}) has {len(ref_units)}: the files "
                                   f"are not parallel{detail}",
                             expected=f"the same {what} as {ref_path}, translated")
        missing = next((u for u in ref_units if u.key not in by_key), None)
        if missing is not None:
            extra = next(u for u in units if u.key not in {r.key for r in ref_units})
            raise InputError(path, f"{extra.where} has no counterpart in {ref_path} ({ref_lang}), which has "
                                   f"{missing.where} that {path} lacks: the files are not parallel",
                             expected=f"the same units as {ref_path} (SQuAD: the same question ids per paragraph)")
        out[lang] = [by_key[u.key] for u in ref_units]
    return out


def _first_difference(ref_units: Sequence[Unit], units: Sequence[Unit], by_key: Mapping[str, Unit]) -> str:
    """'; first: ...' naming a unit one side has and the other lacks (keyed units), or nothing (lines)."""
    ref_keys = {u.key for u in ref_units}
    missing = next((u for u in ref_units if u.key not in by_key), None)
    extra = next((u for u in units if u.key not in ref_keys), None)
    if missing is not None and not missing.key.startswith("#"):
        return f"; first unit without a counterpart: {missing.where}"
    if extra is not None and not extra.key.startswith("#"):
        return f"; first unit without a counterpart: {extra.where}"
    return ""


__all__ = ["FORMATS", "SQUAD_UNITS", "Unit", "align", "clean", "detect_format", "read_lines", "read_parallel",
           "read_squad", "read_tsv_pairs"]
