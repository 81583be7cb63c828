"""Entity-aware choice of masked-LM targets (seed 003, US 12,393,781 B2).

Random masking often hides words that carry no domain knowledge ("in") and, worse, can hide
both halves of a pair that only make sense together ("early enhancement" ... "HCC"): then
neither can be predicted from the other. The patent's remedy, implemented here:

1. extract specific term phrases ("entities") with typed dictionaries (YAML term lists) or
   a token-classification model (BIO labels; e.g. this project's fine-tuned NER);
2. derive the degree of association of every pair of entities from a type-pair table
   (YAML; the patent's FIG. 8 is the shipped default);
3. choose targets under the patent's three conditions (FIG. 10, FIG. 11): at least 15 % of
   the text's tokens, rounded up, are masked; at least one entity is among the targets; every
   entity whose association with a selected target is >= the threshold stays visible.

A configurable share of instances keeps plain random (whole-word) masking, as the patent's
training texts "also include a certain number" made the typical way. Under same-type grouping
(Embodiment 3) ``EntityMasker.describe``/``same_type`` say which texts of a document share a
target's input; ``orchestrator.instances.grouped`` builds those inputs.

Everything here is pure Python on WordPiece tokens; the instance builder calls
``EntityMasker.select`` and applies BERT's 80/10/10 replacement itself. The entities come from
``orchestrator.instances.entities`` (term lists, NER model), their degrees of association from
``orchestrator.instances.association`` (FIG. 8's table, or one derived from the corpus).
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import file_sha256
from orchestrator.instances.association import AssociationTable, load_association
from orchestrator.instances.entities import (
    SPECIAL_TOKENS,
    Entity,
    NerExtractor,
    PhraseMatcher,
    load_dictionaries,
    token_words,
)

_HERE = Path(__file__).resolve().parent
DEFAULT_DICTIONARY = _HERE / "term_lists" / "radiology.yaml"
DEFAULT_ASSOCIATION = _HERE / "association" / "patent_fig8.yaml"
DEFAULT_ORGAN_RULES = _HERE / "organs" / "radiology.yaml"
#: Version of the target choice, part of the instances stage's key when entity masking is on
#: (``InstanceConfig.output_fields``): bumped whenever the same settings give other instances.
#: 2: condition 1 as a floor without the max_predictions_per_seq cap, entities longer than the budget as
#: targets; same-type grouping chooses the target first and builds its input (was: a reorder of sentences).
ENTITY_MASKING_VERSION = 2
SameTypeRule = Literal["none", "association", "organ"]
AssociationMethod = Literal["table", "npmi"]
AssociationWindow = Literal["sentence", "document"]
AssociationLevel = Literal["type", "term"]
GroupedNext = Literal["within_group", "document", "any_type"]


@dataclass(frozen=True)
class EntityMaskingConfig:
    dictionaries: tuple[str, ...] = field(
        (), help="YAML typed term lists (types -> name -> terms/patterns); empty = the shipped "
                 "orchestrator/instances/term_lists/radiology.yaml")
    ner_model: str = field(
        "", help="Hugging Face token-classification directory, or a sweep export of an NER task "
                 "(sweep.export_best: <sweep>/exports/<trial>-<key>, e.g. BC5CDR-chemical): "
                 "entities and their types come from its BIO predictions instead of the dictionaries; types "
                 "are the label suffixes lowercased (B-Chemical -> chemical)")
    association: str = field(
        "", help="YAML type-pair table of degrees of association; empty = the patent's FIG. 8 "
                 "(orchestrator/instances/association/patent_fig8.yaml). Read only with association_method: table")
    association_method: AssociationMethod = field(
        "table", help="table: the degrees come from `association`; npmi: derived from the corpus before instance "
                      "creation (a Ray Data pass over the plan's documents): normalised PMI of two entity types "
                      "co-occurring in one association_window, 10 x max(0, NPMI) on FIG. 8's 0-10 scale, written "
                      "next to the instances as association.yaml (reusable as `association: <path>`)")
    association_window: AssociationWindow = field(
        "sentence", help="npmi: the window two entity types co-occur in, a sentence (text) or a whole document")
    association_min_count: int = field(
        5, help="npmi: type pairs co-occurring in fewer windows than this are left out of the table "
                "(degree `default` 0): too rare for a stable estimate")
    association_level: AssociationLevel = field(
        "type", help="what the association relates: type (FIG. 8: two entity types, e.g. disease name and lesion "
                     "name) or term (two extracted term phrases by their text, e.g. cisplatin and nephrotoxicity; "
                     "the table's pairs are terms). term suits one-type extractors (a BC5CDR-chemical model), "
                     "where a type table has a single entry")
    threshold: float = field(8.0, help="entities whose association with a selected target is >= this stay "
                                       "visible (8 on FIG. 8's 0-10 scale in the patent)")
    masked_fraction: float = field(0.15, help="condition 1: at least this share of the text's tokens is masked, "
                                              "special tokens not counted, rounded up (25 tokens x 0.15 -> 4); "
                                              "replaces instances.masked_lm_prob, no max_predictions_per_seq cap")
    plain_random_share: float = field(0.1, help="share of instances that keep plain random whole-word masking")
    same_type_grouping: SameTypeRule = field(
        "none", help="Embodiment 3: choose the target first, then build its training input from its text "
                     "(sentence) and the document's texts of the same type, no text of another type with them, "
                     "NSP pairs drawn inside that rule. association: texts holding an entity associated with "
                     "the target at >= threshold (3_1); organ: texts about the same organ by organ_rules (3_2); "
                     "none: BERT's packing of consecutive sentences")
    grouped_next: GroupedNext = field(
        "within_group", help="same_type_grouping's NSP pairs. within_group (Embodiment 3): a group of one text always "
                             "gets a random next segment, so most pairs are random next (0.85 of them on the PubMed "
                             "sample, where BERT's packing gives 0.62); document: a group of one text gets its "
                             "document's following texts as a real next segment half the time, whatever their type "
                             "(BERT's fair coin; those texts break the grouping's rule in that input: a check of "
                             "what NSP's share does, not the patent's method; docs/METHODS.md); any_type: as "
                             "within_group, but a random next segment is BERT's, another document's consecutive "
                             "texts from a random one, whatever their type (not the patent's: a check of what "
                             "same-type random segments do to NSP)")
    organ_rules: str = field(
        "", help="YAML organ rule table for same_type_grouping: organ, in the term-list format with organs as "
                 "the types; a text naming no organ describes the organ of the text before it; empty = "
                 "orchestrator/instances/organs/radiology.yaml")
    prefer_entities: bool = field(True, help="after the first target entity, fill the budget with further "
                                             "unprotected entities before ordinary words; false = draw the "
                                             "rest uniformly from entities and words")
    max_phrase_words: int = field(6, help="longest term phrase, in words, that a dictionary can match")
    lowercase: bool = field(True, help="match terms case-insensitively (right for uncased vocabularies)")

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_fraction < 1.0:
            raise ConfigError(f"masked_fraction must be in (0, 1), got {self.masked_fraction}")
        if not 0.0 <= self.plain_random_share <= 1.0:
            raise ConfigError(f"plain_random_share must be in [0, 1], got {self.plain_random_share}")
        if self.max_phrase_words < 1:
            raise ConfigError(f"max_phrase_words must be >= 1, got {self.max_phrase_words}")
        for path in self.dictionaries:
            if not Path(path).is_file():
                raise ConfigError(f"entity dictionary not found: {path}")
        if self.ner_model and self.dictionaries:
            raise ConfigError("give either dictionaries or ner_model as the entity extractor, not both")
        if self.ner_model and not (Path(self.ner_model) / "config.json").is_file():
            raise ConfigError(f"ner_model is not a Hugging Face model directory (no config.json): {self.ner_model}")
        if self.association_min_count < 1:
            raise ConfigError(f"association_min_count must be >= 1, got {self.association_min_count}")
        if self.association and self.association_method != "table":
            raise ConfigError(f"association ({self.association}) is a table, read only with association_method: "
                              f"table (it is {self.association_method!r}); give one or the other")
        if self.association and not Path(self.association).is_file():
            raise ConfigError(f"association table not found: {self.association}")
        if self.grouped_next != "within_group" and self.same_type_grouping == "none":
            raise ConfigError("grouped_next is read only with same_type_grouping association or organ (it is "
                              "'none': BERT's packing draws its own next segments); leave grouped_next out")
        if self.organ_rules and self.same_type_grouping != "organ":
            raise ConfigError(f"organ_rules is read only with same_type_grouping: organ "
                              f"(it is {self.same_type_grouping!r})")
        if self.organ_rules and not Path(self.organ_rules).is_file():
            raise ConfigError(f"organ rule table not found: {self.organ_rules}")

    def table_digests(self) -> dict[str, str]:
        """sha256 of each YAML table given here that the masker reads (term lists, unless an NER model extracts;
        the association table, with association_method table; the organ rules, with same_type_grouping organ):
        the instances depend on their contents, not on their paths (an edited term list kept its instances and
        the pretraining on them: a probe, session 46). The shipped tables are the code's (``ENTITY_MASKING_VERSION``
        moves with them), so a config of none keeps its key."""
        tables = [] if self.ner_model else [Path(p) for p in self.dictionaries]
        if self.association_method == "table" and self.association:
            tables.append(Path(self.association))
        if self.same_type_grouping == "organ" and self.organ_rules:
            tables.append(Path(self.organ_rules))
        return {str(path): file_sha256(path) for path in tables}


@dataclass(frozen=True)
class TextInfo:
    """One text (sentence) of a document as same-type grouping sees it: its entities (token
    positions within the text), their types (their texts under association_level: term), and the
    organ it describes (organ rule only)."""
    entities: tuple[Entity, ...]
    types: frozenset[str]
    organ: str | None


# --------------------------------------------------------------------------------- masking
class EntityMasker:
    """Chooses masked-LM target positions for one instance under the patent's three conditions,
    and says which texts are of the same type as a target's text (Embodiment 3)."""

    def __init__(self, cfg: EntityMaskingConfig, association: AssociationTable | None = None):
        """``association``: the table to use instead of reading ``cfg.association`` (a derived one, or
        an empty one where only extraction is wanted); required with ``association_method`` other than table."""
        self.cfg = cfg
        self.ner = NerExtractor(cfg.ner_model) if cfg.ner_model else None
        self.dictionary = load_dictionaries(() if self.ner else cfg.dictionaries or (DEFAULT_DICTIONARY,),
                                            cfg.lowercase)
        self.types = self.ner.types if self.ner else self.dictionary.types
        if association is None and cfg.association_method != "table":
            raise ConfigError(f"association_method: {cfg.association_method} derives the table from the corpus "
                              "(orchestrator.instances.association); pass the derived table to EntityMasker")
        self.association = association if association is not None else \
            load_association(cfg.association or DEFAULT_ASSOCIATION,
                             self.types if cfg.association_level == "type" else None)
        self.matcher = PhraseMatcher(self.dictionary, cfg.max_phrase_words)
        self.organs = None
        if cfg.same_type_grouping == "organ":
            self.organs = PhraseMatcher(load_dictionaries((cfg.organ_rules or DEFAULT_ORGAN_RULES,), cfg.lowercase),
                                        cfg.max_phrase_words)

    # ---- extraction -------------------------------------------------------------------
    def words(self, tokens: Sequence[str]) -> list[tuple[str, tuple[int, ...]]]:
        """Whole words rebuilt from WordPiece tokens: (word, token positions); special tokens skipped."""
        return token_words(tokens, self.cfg.lowercase)

    def extract(self, tokens: Sequence[str]) -> list[Entity]:
        """Typed term phrases (dictionary longest match, or NER spans); a phrase never spans a special token."""
        words = self.words(tokens)
        entities: list[Entity] = []
        for run in _runs(words):
            spans = self.ner([words[j][0] for j in run]) if self.ner is not None else \
                self.matcher([words[j][0] for j in run])
            for start, end, type_name in spans:
                members = run[start:end]
                entities.append(Entity(start=members[0], end=members[-1] + 1,
                                       positions=tuple(p for j in members for p in words[j][1]),
                                       type=type_name, text=" ".join(words[j][0] for j in members)))
        return entities

    def key(self, entity: Entity) -> str:
        """What the association table relates for ``entity``: its type, or its text (association_level)."""
        return entity.type if self.cfg.association_level == "type" else entity.text

    # ---- selection --------------------------------------------------------------------
    def num_to_predict(self, tokens: Sequence[str]) -> int:
        """Condition 1's floor: ceil(masked_fraction x the text's tokens), special tokens not counted
        (25 tokens x 0.15 = 3.75 -> 4); at least 1 for a non-empty text. No cap: condition 1 is a floor."""
        n = sum(1 for t in tokens if t not in SPECIAL_TOKENS)
        return max(1, math.ceil(n * self.cfg.masked_fraction)) if n else 0

    def select(self, tokens: list[str], rng: random.Random, num_to_predict: int,
               target: Sequence[int] | None = None, group: range | None = None) -> tuple[list[int], dict]:
        """Sorted token positions to mask and {"entities", "masked_entities", "protected"} counts.

        With probability ``plain_random_share`` (and when the text holds no entity) the instance
        keeps plain random whole-word masking. Otherwise the patent's three conditions hold:
        an entity is the first target (condition 2) — the entity at the token positions ``target``
        when the caller chose it beforehand (same-type grouping), else one drawn uniformly among
        the entities that fit the budget (the shortest when none does); every entity associated
        with any selected target at >= threshold stays visible (condition 3); at least
        ``num_to_predict`` tokens are masked (condition 1): the budget is filled with further
        whole units — unprotected entities first when ``prefer_entities``, then words — and when
        no unit fits exactly what is left, the smallest ones are taken until the budget is met
        (an overshoot smaller than one unit). Only when every unprotected token is already
        masked can the floor be missed.

        ``group``: the token positions of the texts grouped with the target (same-type grouping,
        a random next segment beside them); entities outside it are neither targets nor masked,
        since the texts of their type are not in this input.
        """
        words = self.words(tokens)
        entities = self.extract(tokens)
        stats = {"entities": len(entities), "masked_entities": 0, "protected": 0}
        plain = rng.random() < self.cfg.plain_random_share
        if num_to_predict <= 0 or not words:
            return [], stats
        if plain or not entities:
            return self._plain_random(words, entities, rng, num_to_predict, stats)

        # units: ("e", entity index) or ("w", word token positions); entities are masked whole
        in_entity = {j for e in entities for j in range(e.start, e.end)}
        ordinary = [("w", pos) for j, (_, pos) in enumerate(words) if j not in in_entity]
        eligible = [i for i, e in enumerate(entities) if group is None or all(q in group for q in e.positions)]
        first = self._first_target(entities, eligible, rng, num_to_predict, target) if eligible else None
        others = [("e", i) for i in eligible if i != first]
        rng.shuffle(others)
        rng.shuffle(ordinary)
        order = others + ordinary
        if not self.cfg.prefer_entities:
            rng.shuffle(order)

        chosen: list[int] = []
        selected: set[int] = set()
        protected: set[int] = set()

        def positions(unit: tuple) -> tuple[int, ...]:
            return entities[unit[1]].positions if unit[0] == "e" else unit[1]

        def take(unit: tuple) -> None:
            chosen.extend(positions(unit))
            if unit[0] == "e":
                i = unit[1]
                selected.add(i)
                protected.update(j for j, other in enumerate(entities) if j not in selected and
                                 self.association(self.key(entities[i]), self.key(other)) >= self.cfg.threshold)

        if first is not None:
            take(("e", first))
        overflow: list[tuple] = []
        for unit in order:
            if len(chosen) >= num_to_predict:
                break
            if unit[0] == "e" and unit[1] in protected:
                continue
            if len(chosen) + len(positions(unit)) > num_to_predict:
                overflow.append(unit)
                continue
            take(unit)
        for unit in sorted(overflow, key=lambda u: len(positions(u))):  # stable: random order among equals
            if len(chosen) >= num_to_predict:
                break
            if not (unit[0] == "e" and unit[1] in protected):
                take(unit)
        stats["masked_entities"] = len(selected)
        stats["protected"] = len(protected)
        return sorted(chosen), stats

    def _first_target(self, entities: list[Entity], eligible: list[int], rng: random.Random, num_to_predict: int,
                      target: Sequence[int] | None) -> int:
        """Index of the first target: the entity at ``target`` if there is one, else a uniform draw among
        the ``eligible`` entities that fit the budget, else among the shortest (condition 2 over an exact budget)."""
        if target is not None:
            for i in eligible:
                if entities[i].positions == tuple(target):
                    return i
        fitting = [i for i in eligible if len(entities[i].positions) <= num_to_predict]
        if not fitting:
            shortest = min(len(entities[i].positions) for i in eligible)
            fitting = [i for i in eligible if len(entities[i].positions) == shortest]
        return rng.choice(fitting)

    def _plain_random(self, words, entities, rng, num_to_predict, stats):
        """BERT's whole-word random masking; entities merely counted."""
        units = [pos for _, pos in words]
        rng.shuffle(units)
        chosen: list[int] = []
        for positions in units:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(positions) > num_to_predict:
                continue
            chosen.extend(positions)
        masked = set(chosen)
        stats["masked_entities"] = sum(1 for e in entities if masked.intersection(e.positions))
        return sorted(chosen), stats

    # ---- same type (Embodiment 3) --------------------------------------------------------
    def describe(self, texts: Sequence[Sequence[str]]) -> list[TextInfo]:
        """Each text of one document (WordPiece tokens, or words) with its entities and, under the
        organ rule, its organ: the organ it names most often (ties: the first named), else the organ
        of the text before it — a report describes one organ over several texts (Embodiment 3_2's
        determination model, as a rule table)."""
        out: list[TextInfo] = []
        previous: str | None = None
        for tokens in texts:
            entities = tuple(self.extract(tokens))
            organ = None
            if self.organs is not None:
                words = self.words(tokens)
                named = [type_name for run in _runs(words)
                         for _, _, type_name in self.organs([words[j][0] for j in run])]
                organ = max(named, key=lambda o: (named.count(o), -named.index(o))) if named else previous
                previous = organ
            out.append(TextInfo(entities, frozenset(self.key(e) for e in entities), organ))
        return out

    def kind(self, text: TextInfo, target: Entity | None) -> tuple:
        """What a text must be to be "of the same type" as ``text`` when ``target`` (one of its
        entities) is the target: under ``association``, hold an entity whose association with
        the target's type is >= the threshold (Embodiment 3_1); under ``organ``, describe the
        same organ, or no organ when ``text`` names none (3_2). A text without a target groups
        with the texts of no type (``untyped``)."""
        if self.cfg.same_type_grouping == "organ":
            return ("organ", text.organ)
        if target is None:
            return self.untyped()
        return ("associated", self.key(target))

    def untyped(self) -> tuple:
        """The kind of a text of no type: no entity (association), no organ (organ rule)."""
        return ("organ", None) if self.cfg.same_type_grouping == "organ" else ("untyped",)

    def is_kind(self, text: TextInfo, kind: tuple) -> bool:
        if kind[0] == "organ":
            return text.organ == kind[1]
        if kind[0] == "untyped":
            return not text.entities
        return any(self.association(kind[1], t) >= self.cfg.threshold for t in text.types)

    def same_type(self, texts: Sequence[TextInfo], anchor: int, target: Entity | None) -> list[int]:
        """The texts of one document of the same type as text ``anchor`` with ``target`` its target,
        in document order, ``anchor`` included: the patent's texts "collectively input" (FIG. 20, 24)."""
        kind = self.kind(texts[anchor], target)
        return [i for i, text in enumerate(texts) if i == anchor or self.is_kind(text, kind)]


def _runs(words: Sequence[tuple[str, tuple[int, ...]]]) -> list[list[int]]:
    """Indices of ``words`` in runs with no special token between them."""
    runs: list[list[int]] = []
    for j, (_, pos) in enumerate(words):
        if runs and words[runs[-1][-1]][1][-1] + 1 == pos[0]:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs


__all__ = ["ENTITY_MASKING_VERSION", "EntityMaskingConfig", "EntityMasker", "TextInfo"]
