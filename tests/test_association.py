"""The association derived from the corpus (issue 15): known NPMI answers, the table it writes, and
the instances key. The stage's Ray pass is tested in tests/test_corpus.py
(``test_derived_association_...``), beside the other instance builds on Ray: there the Ray session
and its warmed Ray Data workers are already paid (~30 s on a loaded 2-core machine)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.core.config import from_dict
from orchestrator.core.errors import ConfigError
from orchestrator.core.reuse import content_key
from orchestrator.instances.association import (
    Cooccurrence,
    derive_association,
    load_association,
    npmi,
    write_association,
)
from orchestrator.instances.config import InstanceConfig
from orchestrator.instances.entity_masking import EntityMaskingConfig

TERMS = "types:\n" + "".join(f"  {t}:\n    terms: [{w}]\n" for t, w in
                             (("a", "alpha"), ("b", "beta"), ("c", "gamma"), ("d", "delta")))


def test_npmi_known_answers_and_scale():
    """8 windows: a and b always together (twice), a and c never, c and d once of two each."""
    counts = Cooccurrence()
    for window in (["a", "b"], ["b", "a"], ["c", "d"], ["c"], ["d"], [], [], []):
        counts.add(window)
    assert counts.windows == 8 and counts.types == {"a": 2, "b": 2, "c": 2, "d": 2}
    assert dict(counts.pairs) == {("a", "b"): 2, ("c", "d"): 1}
    table, rows = derive_association(counts, min_count=1)
    # (a, b): p(a,b) = 2/8, p(a) p(b) = 1/16 -> PMI = log 4, normalised by -log(1/4): NPMI 1 -> 10
    assert table("a", "b") == table("b", "a") == 10.0
    # (c, d): p(c,d) = 1/8, p(c) p(d) = 1/16 -> log 2 / log 8 = 1/3 -> 3.333
    assert npmi(1, 2, 2, 8) == pytest.approx(1 / 3)
    assert table("c", "d") == 3.333
    assert table("a", "c") == 0.0 and npmi(0, 2, 2, 8) == -1.0  # never together
    assert {tuple(r["pair"]): r["together"] for r in rows} == {("a", "b"): 2, ("c", "d"): 1}
    # below min_count: left out of the table (the default 0)
    strict, _ = derive_association(counts, min_count=2)
    assert set(strict.pairs) == {frozenset("ab")} and strict("c", "d") == 0.0
    # worse than chance is 0, not negative: b in 3 of 4 windows, a in 2, together once
    anti = Cooccurrence()
    for window in (["a", "b"], ["a"], ["b"], ["b"]):
        anti.add(window)
    assert npmi(1, 2, 3, 4) == pytest.approx(math.log(1 / 4 / (2 / 4 * 3 / 4)) / -math.log(1 / 4))
    assert derive_association(anti, 1)[0]("a", "b") == 0.0


def test_self_pairs_windows_and_merge_are_order_free():
    sentences = [["a", "a"], ["b"], ["a", "c"]]
    by_sentence, by_document = Cooccurrence(), Cooccurrence()
    by_sentence.add_document(sentences, "sentence")
    by_document.add_document(sentences, "document")
    assert by_sentence.windows == 3 and dict(by_sentence.pairs) == {("a", "a"): 1, ("a", "c"): 1}
    assert by_document.windows == 1 and dict(by_document.pairs) == {
        ("a", "a"): 1, ("a", "b"): 1, ("a", "c"): 1, ("b", "c"): 1}
    halves = Cooccurrence.from_dict(json.loads(json.dumps(by_document.to_dict()))).merge(by_sentence)
    other = Cooccurrence().merge(by_sentence).merge(by_document)
    assert halves == other


def test_written_table_loads_as_a_shipped_table(tmp_path: Path):
    counts = Cooccurrence()
    for window in (["a", "b"], ["a", "b"], ["c", "d"], ["c", "c"], ["d"], []):
        counts.add(window)
    table, _ = derive_association(counts, 1)
    path = write_association(table, tmp_path / "association.yaml", header=("derived",))
    loaded = load_association(path, frozenset("abcd"))
    assert loaded == table and loaded("c", "c") > 0


def test_config_and_key_unchanged_for_tables_changed_when_derived():
    def key(data: dict) -> str:
        return content_key("instances", from_dict(InstanceConfig, data).output_fields(), 128, "corpuskey", "vocabkey")

    # computed before the derived association existed
    assert key({}) == "91ebf873de38c935"
    assert key({"entity_masking": {}}) == "74c07f15f81efb71"
    # a table given by path: its contents enter the key since session 46 (it was "02a109df53e77ab6", the path only,
    # so an edited table kept its instances)
    assert key({"entity_masking": {"association": "orchestrator/instances/association/patent_fig8.yaml",
                                   "threshold": 7}}) == "17a16aa58de862d6"
    assert key({"entity_masking": {"association_level": "type"}}) == "74c07f15f81efb71"
    assert key({"entity_masking": {"association_level": "term"}}) != "74c07f15f81efb71"
    derived = key({"entity_masking": {"association_method": "npmi"}})
    assert derived not in ("74c07f15f81efb71", key({"entity_masking": {"association_method": "npmi",
                                                                        "association_window": "document"}}),
                           key({"entity_masking": {"association_method": "npmi", "association_min_count": 2}}))
    with pytest.raises(ConfigError, match="association_method: table"):
        EntityMaskingConfig(association="orchestrator/instances/association/patent_fig8.yaml",
                            association_method="npmi")
    with pytest.raises(ConfigError, match="association_min_count"):
        EntityMaskingConfig(association_method="npmi", association_min_count=0)
