"""Same-type grouping (seed 003, Embodiment 3): the target is chosen first, then its input is built.

BERT packs consecutive sentences up to a length and may pair them with a random segment of
another document, so a target ("HCC is suspected.") can land in an input without the texts that
make it predictable, or beside a text about another organ. Here, per document and pass:

1. a target entity is drawn uniformly among the entities of the texts (sentences) not yet used;
2. its input holds the target's text and the document's unused texts of the same type
   (``EntityMasker.same_type``: an associated entity, or the same organ), nearest first while
   they fit ``max_seq_length``, in document order; texts that do not fit wait for a later input,
   no text of another type joins;
3. NSP is drawn inside the group: as in BERT, a group of one text, or a fair coin, gives a random
   next segment — A is then the whole group and B texts of the same kind from another document
   (else texts of no type, else nothing: an empty B, still labelled random); otherwise A and B
   split the group at a random text (B is the group's next texts, label "real next"). With
   ``grouped_next: document`` (not the patent's: a check of NSP's share), a group of one text gets
   the document's following texts as a real next segment on a fair coin, whatever their type; with
   ``grouped_next: any_type`` (not the patent's either: a check of what same-type random segments do to NSP), a
   random next segment is BERT's, a random other document's texts from a random one, whatever their type;
4. the masker takes the drawn entity as its first target, so conditions 1-3 hold in that input;
   the entities of a random next segment (texts whose group is elsewhere) are never masked.

When no text with an entity is left, the remaining texts are grouped the same way around the
first of them (no target: texts of no type together, or texts of one organ). The random stream is
not BERT's; the instance format, the truncation and the masking are.
"""
from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

from orchestrator.instances.config import Params, Specials
from orchestrator.instances.entities import Entity
from orchestrator.instances.entity_masking import EntityMasker, TextInfo
from orchestrator.instances.exact import Instance, truncate_seq_pair
from orchestrator.instances.masking import create_masked_lm_predictions


class Partners:
    """The unit's texts by kind (``EntityMasker.kind``), for the random next segment of a group."""

    def __init__(self, docs: Sequence[Sequence[Sequence[int]]], infos: Sequence[Sequence[TextInfo]],
                 masker: EntityMasker):
        self.docs, self.infos, self.masker = docs, infos, masker
        self.pools: dict[tuple, list[tuple[int, int]]] = {}

    def pool(self, kind: tuple) -> list[tuple[int, int]]:
        if kind not in self.pools:
            self.pools[kind] = [(d, i) for d, texts in enumerate(self.infos) for i, text in enumerate(texts)
                                if self.masker.is_kind(text, kind)]
        return self.pools[kind]

    def draw(self, kind: tuple, d: int, rng: random.Random, target_length: int) -> list[tuple[int, int]]:
        """(document, text) of a random next segment for a group of ``kind`` in document ``d``: a
        text of that kind in another document (10 tries, as BERT), then the texts after it while
        they are of the kind too and B is shorter than ``target_length``; else the same from the
        texts of no type; else none."""
        for k in dict.fromkeys((kind, self.masker.untyped())):
            pool = self.pool(k)
            if not pool:
                continue
            for _ in range(10):
                other, i = pool[rng.randint(0, len(pool) - 1)]
                if other != d:
                    break
            else:
                continue
            return self._run(other, i, target_length, k)
        return []

    def draw_any(self, d: int, rng: random.Random, target_length: int) -> list[tuple[int, int]]:
        """(document, text) of BERT's random next segment for document ``d`` (``grouped_next: any_type``): another
        document (10 tries; then, as BERT, the last one drawn), its texts from a random one while B is shorter
        than ``target_length``, whatever their type."""
        for _ in range(10):
            other = rng.randint(0, len(self.docs) - 1)
            if other != d:
                break
        return self._run(other, rng.randint(0, len(self.docs[other]) - 1), target_length)

    def _run(self, other: int, i: int, target_length: int, kind: tuple | None = None) -> list[tuple[int, int]]:
        """Text ``i`` of document ``other`` and the texts after it while B is shorter than ``target_length`` (and,
        given a ``kind``, they are of it)."""
        run, length = [(other, i)], len(self.docs[other][i])
        while length < target_length and i + 1 < len(self.docs[other]) and \
                (kind is None or self.masker.is_kind(self.infos[other][i + 1], kind)):
            i += 1
            run.append((other, i))
            length += len(self.docs[other][i])
        return run


def create_grouped_instances(documents: Sequence[Sequence[Sequence[int]]], sources: Sequence[str],
                             dupe_factor: int, p: Params, sp: Specials, rng: random.Random, masker: EntityMasker,
                             id_to_token: Sequence[str]) -> list[Instance]:
    """``create_training_instances`` with same-type grouping: drop empty documents, shuffle them,
    ``dupe_factor`` passes (each draws its own targets, so its own groups), shuffle the instances."""
    kept = [(d, s) for d, s in zip(documents, sources) if d]
    order = list(range(len(kept)))
    rng.shuffle(order)
    docs = [kept[i][0] for i in order]
    doc_sources = [kept[i][1] for i in order]
    infos = [masker.describe([[id_to_token[t] for t in s] for s in doc]) for doc in docs]
    partners = Partners(docs, infos, masker)
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for d in range(len(docs)):
            instances.extend(grouped_instances_from_document(docs, infos, d, partners, p, sp, rng, masker,
                                                             id_to_token, doc_sources[d]))
    rng.shuffle(instances)
    return instances


def plan_groups(texts: Sequence[TextInfo], lengths: Sequence[int], masker: EntityMasker, rng: random.Random,
                max_num_tokens: int) -> list[tuple[list[int], int, Entity | None]]:
    """One document's texts as (group, anchor, target) in the order drawn: each text in exactly one group.

    The target is drawn uniformly among the entities of the texts left (none when no text with an
    entity is left: the first text left anchors); its group is its text plus the texts left of its
    kind (``EntityMasker.kind``), nearest first while the group fits ``max_num_tokens``, in
    document order. A text of another kind never joins; one that does not fit waits."""
    remaining = list(range(len(texts)))
    groups = []
    while remaining:
        targets = [(i, e) for i in remaining for e in texts[i].entities]
        anchor, target = rng.choice(targets) if targets else (remaining[0], None)
        kind = masker.kind(texts[anchor], target)
        group, length = [anchor], lengths[anchor]
        for i in sorted((i for i in remaining if i != anchor and masker.is_kind(texts[i], kind)),
                        key=lambda i: abs(i - anchor)):
            if length + lengths[i] <= max_num_tokens:
                group.append(i)
                length += lengths[i]
        group.sort()
        taken = set(group)
        remaining = [i for i in remaining if i not in taken]
        groups.append((group, anchor, target))
    return groups


def grouped_instances_from_document(docs: Sequence[Sequence[Sequence[int]]], infos: Sequence[Sequence[TextInfo]],
                                    d: int, partners: Partners, p: Params, sp: Specials, rng: random.Random,
                                    masker: EntityMasker, id_to_token: Sequence[str], source: str = ""
                                    ) -> list[Instance]:
    """One pass over document ``d``: an input per group (``plan_groups``), NSP drawn inside the grouping."""
    document, texts = docs[d], infos[d]
    max_num_tokens = p.max_seq_length - 3
    target_length = max_num_tokens  # of a random next segment (BERT's short_seq_prob)
    if rng.random() < p.short_seq_prob:
        target_length = rng.randint(2, max_num_tokens)
    instances = []
    for group, anchor, target in plan_groups(texts, [len(s) for s in document], masker, rng, max_num_tokens):
        length = sum(len(document[i]) for i in group)
        following = _following(document, group[-1], target_length - length) \
            if len(group) == 1 and masker.cfg.grouped_next == "document" else []
        if following and rng.random() < 0.5:  # grouped_next: document, a lone text's real next (BERT's coin)
            a_texts, b_texts, is_random_next, b_grouped = [(d, anchor)], [(d, i) for i in following], False, False
        elif len(group) == 1 or rng.random() < 0.5:
            a_texts = [(d, i) for i in group]
            b_texts = partners.draw_any(d, rng, target_length - length) if masker.cfg.grouped_next == "any_type" \
                else partners.draw(masker.kind(texts[anchor], target), d, rng, target_length - length)
            is_random_next, b_grouped = True, False
        else:
            a_end = rng.randint(1, len(group) - 1)
            a_texts, b_texts = [(d, i) for i in group[:a_end]], [(d, i) for i in group[a_end:]]
            is_random_next, b_grouped = False, True
        instances.append(_instance(docs, a_texts, b_texts, is_random_next, b_grouped, (d, anchor), target,
                                   max_num_tokens, p, sp, rng, masker, id_to_token, source))
    return instances


def _following(document: Sequence[Sequence[int]], last: int, target_length: int) -> list[int]:
    """The texts after text ``last`` of ``document``, in order, while they are shorter than ``target_length``
    together (at least one; none when ``last`` is the document's last text): a lone text's real next segment
    under ``grouped_next: document``, whatever their type."""
    out, length = [], 0
    for i in range(last + 1, len(document)):
        if out and length >= target_length:
            break
        out.append(i)
        length += len(document[i])
    return out


def _instance(docs, a_texts: list[tuple[int, int]], b_texts: list[tuple[int, int]], is_random_next: bool,
              b_grouped: bool, anchor: tuple[int, int], target: Entity | None, max_num_tokens: int, p: Params,
              sp: Specials, rng: random.Random, masker: EntityMasker, id_to_token: Sequence[str],
              source: str) -> Instance:
    """``[CLS] A [SEP] B [SEP]`` truncated as BERT does, masked with ``target`` as the first target; B's entities
    are masked too only when B is of A's group (``b_grouped``)."""
    tokens_a = [t for d, i in a_texts for t in docs[d][i]]
    tokens_b = [t for d, i in b_texts for t in docs[d][i]]
    side = 0 if anchor in a_texts else 1  # the anchor's group is A, or A and B
    segment = b_texts if side else a_texts
    offset = sum(len(docs[d][i]) for d, i in segment[:segment.index(anchor)])
    packed = len(tokens_a) + len(tokens_b)
    fronts = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
    positions = None
    if target is not None:
        kept = len(tokens_b) if side else len(tokens_a)
        inside = [offset + q - fronts[side] for q in target.positions]
        if all(0 <= q < kept for q in inside):  # else truncation cut it: the masker draws a first target
            base = len(tokens_a) + 2 if side else 1
            positions = [base + q for q in inside]
    tokens = [sp.cls, *tokens_a, sp.sep, *tokens_b, sp.sep]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    # a random next segment is another document's texts without their group (a lone text's real next under
    # grouped_next: document, texts of other groups): its entities stay visible
    group = None if b_grouped else range(1, len(tokens_a) + 1)
    tokens, masked, labels, stats = create_masked_lm_predictions(tokens, p, sp, rng, masker, id_to_token, positions,
                                                                 group)
    return Instance(array("i", tokens), array("b", segment_ids), is_random_next, array("i", masked),
                    array("i", labels), source, stats, packed - len(tokens_a) - len(tokens_b))
