"""Mixing strategies: which shards of which corpus each instance-creation unit sees, and how often.

The corpus stage cuts every source into shards of about ``shard_bytes`` (seed 000's
``split_corpus(each_file_size=10MB)``). A mixer turns the shard list into *units*: a unit is
one run of BERT's ``create_training_instances`` over the documents of its member shards,
repeated ``dupe_factor`` times; next-sentence negatives are drawn inside a unit. Mixers are
pure functions of (shards, config, rng), registered in ``MIXERS``:

- ``conventional`` (seed 000, Fig. 3 lines 34-43): one unit per shard, ``dupe_factor`` times
  each, so every corpus contributes its size share and NSP pairs never leave the shard;
- ``simpt`` (Fig. 3 lines 20-33): each unit samples k shards of the small corpora and k of the
  large ones, so the small corpus is up-sampled to half of the instances and NSP negatives pair
  documents across shards;
- ``mdapt`` (seed 002): a sentence budget filled from the domain corpora, the rest from general
  text per language by exponentially smoothed probabilities P(L)^alpha, never the same page
  twice across languages; the languages in ``upsample_from_domain`` (the seed's English: "Except
  for English, we up-sample using Wikipedia data") take their share of the rest from their own
  domain text instead of general text;
- ``weighted``: explicit mixing weights per source (``mixer.weights``), e.g. a proposal from the
  sources' similarity to the target (``jobs/propose_mix.py``): each source feeds its weight's share
  of a byte budget, by whole passes over it plus randomly chosen documents for the rest.
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence

from orchestrator.core.artifacts import Member, MixPlan, ShardInfo, Unit
from orchestrator.core.config import field, is_number
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class MixerConfig:
    name: str = field("simpt", help="conventional | simpt | mdapt | weighted")
    shard_bytes: int = field(10_000_000, help="target shard size in bytes (10 MB in seed 000)")
    dupe_factor: int = field(5, help="conventional/mdapt: passes over each unit, each with fresh masks; "
                                     "simpt: scales the automatic number of units")
    shards_per_side: int = field(10, help="simpt: k shards sampled from the small and from the large "
                                          "corpora per unit (10 + 10 in seed 000)")
    units: int = field(0, help="simpt: number of units (seed 000's n_docs); 0 = enough to cover the "
                               "large corpus dupe_factor times in expectation")
    sentence_budget: int = field(10_000_000, help="mdapt: total sentences (10M in seed 002)")
    alpha: float = field(0.3, help="mdapt: language sampling smoothing P(L)^alpha (0.3 in seed 002)")
    allow_shortfall: bool = field(False, help="mdapt: accept fewer sentences than the budget when the "
                                              "corpora are too small, instead of failing")
    weights: dict[str, float] = field(
        default_factory=dict, help="weighted: share of the instance-creation text per source name (normalised; "
                                   "every source needs one; 0 = the source feeds no instances)")
    total_bytes: int = field(0, help="weighted: bytes of text fed to instance creation, all sources together; "
                                     "0 = the sources' total size x dupe_factor (conventional mixing's amount, "
                                     "redistributed by the weights)")
    upsample_from_domain: tuple[str, ...] = field(
        (), help="mdapt: languages up-sampled from their own domain text instead of general text (seed 002: [en], "
                 "'Except for English, we up-sample using Wikipedia data'); their domain text is not taken whole "
                 "first but drawn up to the language's smoothed share of the budget left after the other "
                 "languages' domain text")
    upsample_sources: tuple[str, ...] = field(
        (), help="mdapt: the domain sources (by name) that are their language's up-sampling pool; the language's "
                 "other domain sources are taken whole first, like every other language's (seed 002's M_D+M_WIKI: "
                 "M_D's English abstracts whole, English up-sampled from more abstracts, E_D); empty = all domain "
                 "text of an upsample_from_domain language is its pool. Each source's language must be in "
                 "upsample_from_domain")

    def __post_init__(self) -> None:
        if self.name not in MIXERS:
            MIXERS.get(self.name)  # raises ConfigError with a suggestion
        if self.shard_bytes < 1:
            raise ConfigError("mixer.shard_bytes must be >= 1")
        if self.dupe_factor < 1:
            raise ConfigError("mixer.dupe_factor must be >= 1")
        if self.shards_per_side < 1:
            raise ConfigError("mixer.shards_per_side must be >= 1")
        if self.units < 0 or self.sentence_budget < 1:
            raise ConfigError("mixer.units must be >= 0 and mixer.sentence_budget >= 1")
        if not 0.0 < self.alpha <= 1.0:
            raise ConfigError("mixer.alpha must be in (0, 1]")
        for name, w in self.weights.items():
            if not is_number(w) or w < 0:
                raise ConfigError(f"mixer.weights.{name}: {w!r}; a weight is a number >= 0")
        if self.name == "weighted" and not sum(self.weights.values()) > 0:
            raise ConfigError("mixer weighted needs mixer.weights with a positive weight, e.g. {pubmed: 0.7, "
                              "wiki: 0.3}")
        if self.total_bytes < 0:
            raise ConfigError("mixer.total_bytes must be >= 0")
        if self.total_bytes and self.name != "weighted":
            raise ConfigError(f"mixer.total_bytes is a weighted setting; mixer {self.name!r} sizes the corpus itself "
                              "(mixer.name weighted feeds total_bytes by the weights)")
        if self.weights and self.name != "weighted":
            raise ConfigError(f"mixer.weights is a weighted setting; mixer {self.name!r} sets each source's share "
                              "itself (mixer.name weighted mixes by the weights)")
        if self.upsample_from_domain and self.name != "mdapt":
            raise ConfigError(f"mixer.upsample_from_domain is an mdapt setting; mixer {self.name!r} has no "
                              "per-language budget")
        if self.upsample_sources and not self.upsample_from_domain:
            raise ConfigError(f"mixer.upsample_sources {list(self.upsample_sources)} needs "
                              "mixer.upsample_from_domain: the languages those sources up-sample")
        if len(set(self.upsample_from_domain)) != len(self.upsample_from_domain) or not all(
                self.upsample_from_domain):
            raise ConfigError(f"mixer.upsample_from_domain {list(self.upsample_from_domain)}: give each language "
                              "code once, none empty")


Mixer = Callable[[Sequence[ShardInfo], MixerConfig, random.Random], MixPlan]
MIXERS: Registry[Mixer] = Registry("mixer")


def planned_bytes(plan: MixPlan, shards: Sequence[ShardInfo]) -> dict[str, int]:
    """Bytes of text each source feeds into instance creation (members x dupe_factor)."""
    by_path = {s.path: s for s in shards}
    out: dict[str, int] = defaultdict(int)
    for unit in plan.units:
        for m in unit.members:
            shard = by_path[m.path]
            size = shard.n_bytes if m.rows is None else sum(shard.doc_bytes[r] for r in m.rows)
            out[shard.source] += size * unit.dupe_factor
    return dict(out)


def _by_role(shards: Sequence[ShardInfo], roles: tuple[str, ...]) -> list[ShardInfo]:
    return [s for s in shards if s.role in roles]


@MIXERS.register("conventional")
def conventional(shards: Sequence[ShardInfo], cfg: MixerConfig, rng: random.Random) -> MixPlan:
    """Seed 000, Fig. 3 lines 34-43: every shard of every corpus, dupe_factor times."""
    units = tuple(Unit(i, (Member(s.path),), cfg.dupe_factor) for i, s in enumerate(shards))
    return MixPlan(units, {"mixer": "conventional", "shards": len(shards), "dupe_factor": cfg.dupe_factor})


@MIXERS.register("simpt")
def simpt(shards: Sequence[ShardInfo], cfg: MixerConfig, rng: random.Random) -> MixPlan:
    """Seed 000, Fig. 3 lines 20-33: each unit = k random small shards + as many bytes of large shards.

    With equal-size shards this is exactly ``random.sample(small, k) + random.sample(large, k)``.
    Shards are cut at document boundaries, so a shard holding one long document (a whole
    Wikipedia article) can be larger than ``shard_bytes``; large shards are therefore drawn
    without replacement until their bytes reach those of the k small ones, which keeps the two
    sides equal in size ("comparable in terms of their file sizes"), the point of the method.
    With fewer than k small shards, k shrinks to their count. Every unit runs once (dupe factor
    1); repetition comes from sampling ``units`` times.
    """
    small = _by_role(shards, ("small", "domain"))
    large = _by_role(shards, ("large", "general"))
    if not small or not large:
        raise ConfigError("mixer simpt needs at least one source with role small and one with role large")
    k = min(cfg.shards_per_side, len(small))
    large_bytes = sum(s.n_bytes for s in large)
    per_unit = sum(s.n_bytes for s in small) * k / len(small)
    n_units = cfg.units or math.ceil(large_bytes / per_unit) * cfg.dupe_factor
    units = []
    for i in range(n_units):
        picked = rng.sample(small, k)
        target = sum(s.n_bytes for s in picked)
        got = 0
        for s in rng.sample(large, len(large)):
            if got >= target:
                break
            picked.append(s)
            got += s.n_bytes
        units.append(Unit(i, tuple(Member(s.path) for s in picked), 1))
    notes = {"mixer": "simpt", "k": k, "units": n_units, "small_shards": len(small), "large_shards": len(large)}
    return MixPlan(tuple(units), notes)


def smoothed_probabilities(sizes: dict[str, int], alpha: float) -> dict[str, float]:
    """q(L) = P(L)^alpha / sum_L' P(L')^alpha with P(L) = size(L) / total (Xue et al., seed 002)."""
    total = sum(sizes.values())
    if total <= 0:
        return {lang: 0.0 for lang in sizes}
    powered = {lang: (n / total) ** alpha for lang, n in sizes.items() if n > 0}
    norm = sum(powered.values())
    return {lang: powered.get(lang, 0.0) / norm for lang in sizes}


def allocate_budget(remaining: int, available: dict[str, int], alpha: float,
                    sizes: dict[str, int] | None = None) -> dict[str, int]:
    """Split ``remaining`` sentences over languages by smoothed probability, capped by what exists.

    The probabilities are those of ``sizes`` (default: ``available``, the sentences each language
    can give). A language whose share exceeds its available sentences gets all it has; the excess
    is redistributed over the others in proportion to their smoothed probabilities (water filling).
    The quotas sum to min(remaining, sum(available)).
    """
    quotas = {lang: 0 for lang in available}
    open_langs = {lang for lang, n in available.items() if n > 0}
    q = smoothed_probabilities(sizes if sizes is not None else available, alpha)
    left = min(remaining, sum(available.values()))
    while left > 0 and open_langs:
        norm = sum(q[lang] for lang in open_langs)
        shares = {lang: left * q[lang] / norm for lang in sorted(open_langs)}
        capped = {lang for lang in open_langs if quotas[lang] + shares[lang] >= available[lang]}
        if capped:
            for lang in capped:
                left -= available[lang] - quotas[lang]
                quotas[lang] = available[lang]
            open_langs -= capped
            continue
        floors = {lang: int(math.floor(s)) for lang, s in shares.items()}
        for lang, n in floors.items():
            quotas[lang] += n
        rest = left - sum(floors.values())
        # Hand out the rounding remainder by largest fractional part (stable by name).
        for lang in sorted(shares, key=lambda x: (floors[x] - shares[x], x))[:rest]:
            quotas[lang] += 1
        left = 0
    return quotas


def select_pages(candidates: dict[str, list[tuple[str, int, object]]], quotas: dict[str, int],
                 rng: random.Random) -> tuple[dict[str, list[object]], dict[str, int]]:
    """Pick random pages per language until its sentence quota is met, never a page twice.

    ``candidates[lang]`` holds (page key, sentences, ref). A page taken in one language is
    excluded from every other language (seed 002: "the same page is not sampled twice across
    languages"); the language that took it may take its other documents (a page's paragraphs, when
    a document is a paragraph). Languages are served round-robin, one document at a time, so no
    language can claim all the shared pages first. Returns the chosen refs and the sentences taken
    per language.
    """
    order = {lang: rng.sample(cands, len(cands)) for lang, cands in sorted(candidates.items())}
    cursor = {lang: 0 for lang in order}
    taken: dict[str, int] = {lang: 0 for lang in order}
    chosen: dict[str, list[object]] = {lang: [] for lang in order}
    owner: dict[str, str] = {}  # page -> the language that took it
    active = [lang for lang in sorted(order) if quotas.get(lang, 0) > 0]
    while active:
        still = []
        for lang in active:
            cands = order[lang]
            while cursor[lang] < len(cands) and owner.get(cands[cursor[lang]][0], lang) != lang:
                cursor[lang] += 1
            if cursor[lang] >= len(cands):
                continue
            page, n_sent, ref = cands[cursor[lang]]
            cursor[lang] += 1
            owner[page] = lang
            chosen[lang].append(ref)
            taken[lang] += n_sent
            if taken[lang] < quotas[lang]:
                still.append(lang)
        active = still
    return chosen, taken


def fill_quotas(candidates: dict[str, list[tuple[str, int, object]]], remaining: int, available: dict[str, int],
                alpha: float, sizes: dict[str, int], rng: random.Random):
    """Quotas by smoothed probability, then pages; a language that runs out of pages before its quota
    (the others took them: parallel text shares its page titles) is capped at what it got and its
    excess goes to the others, as when it has too little text. Repeats until no language falls short
    for want of pages or none is left to take the excess; each round draws from the same seed.
    Returns the quotas, the chosen refs, the sentences taken and what each language could give."""
    seed = rng.getrandbits(64)
    available = dict(available)
    while True:
        quotas = allocate_budget(remaining, available, alpha, sizes)
        chosen, taken = select_pages(candidates, quotas, random.Random(seed))
        short = {lang for lang in quotas if taken.get(lang, 0) < quotas[lang] and available[lang] > taken.get(lang, 0)}
        if not short or sum(taken.values()) >= remaining:
            return quotas, chosen, taken, available
        for lang in short:
            available[lang] = taken.get(lang, 0)


def _units_from_refs(refs: list[tuple[str, int]], shards: Sequence[ShardInfo], cfg: MixerConfig) -> list[Unit]:
    """Group selected (shard path, row) documents into one unit per shard."""
    rows: dict[str, list[int]] = defaultdict(list)
    for path, row in refs:
        rows[path].append(row)
    units = []
    for s in shards:
        if s.path in rows:
            picked = tuple(sorted(rows[s.path]))
            member = Member(s.path, None if len(picked) == s.n_docs else picked)
            units.append(Unit(len(units), (member,), cfg.dupe_factor))
    return units


@MIXERS.register("mdapt")
def mdapt(shards: Sequence[ShardInfo], cfg: MixerConfig, rng: random.Random) -> MixPlan:
    """Seed 002: domain corpora first up to the budget, then general text per language by P(L)^alpha.

    A language of ``cfg.upsample_from_domain`` is up-sampled from its own domain text: that text
    is not taken whole in the first pass but is the language's pool in the second, where the
    language gets its smoothed share of what the budget has left like every other language. Its
    P(L) is that of its general text when a general source of the language is given (the seed's
    probabilities are over Wikipedia), else that of its domain pool. With ``cfg.upsample_sources``
    only those sources are the pool, and the language's other domain text is taken whole first (the
    seed's English: M_D's abstracts whole, then up-sampled from more abstracts).
    """
    domain = _by_role(shards, ("domain", "small"))
    general = _by_role(shards, ("general", "large"))
    if not domain:
        raise ConfigError("mixer mdapt needs at least one source with role domain")
    from_domain = set(cfg.upsample_from_domain)
    named = set(cfg.upsample_sources)
    named_langs = {s.language for s in domain if s.source in named}

    def is_pool(s: ShardInfo) -> bool:
        return s.language in from_domain and (s.source in named or s.language not in named_langs)

    refs: list[tuple[str, int]] = []
    domain_taken = 0
    domain_by_lang: dict[str, int] = defaultdict(int)
    for s in domain:  # "simply populating the corpus until reaching the allowance"
        if is_pool(s):
            continue
        for row, n in enumerate(s.doc_sentences):
            if domain_taken >= cfg.sentence_budget:
                break
            refs.append((s.path, row))
            domain_taken += n
            domain_by_lang[s.language] += n
    remaining = max(0, cfg.sentence_budget - domain_taken)
    candidates: dict[str, list[tuple[str, int, object]]] = defaultdict(list)
    sizes: dict[str, int] = defaultdict(int)
    for s in general:
        sizes[s.language] += s.n_sentences
        if s.language in from_domain:
            continue
        for row, (page, n) in enumerate(zip(s.pages, s.doc_sentences)):
            candidates[s.language].append((page, n, (s.path, row)))
    pool: dict[str, int] = defaultdict(int)
    for s in domain:
        if is_pool(s):
            pool[s.language] += s.n_sentences
            for row, (page, n) in enumerate(zip(s.pages, s.doc_sentences)):
                candidates[s.language].append((page, n, (s.path, row)))
    for lang, n in pool.items():
        sizes[lang] = sizes[lang] or n
    sizes = {lang: sizes.get(lang, 0) for lang in sorted(set(sizes) | set(candidates))}
    available = {lang: sum(c[1] for c in candidates.get(lang, ())) for lang in sizes}
    quotas, chosen, taken, available = fill_quotas(candidates, remaining, available, cfg.alpha, sizes, rng)
    for lang in sorted(chosen):
        refs.extend(chosen[lang])  # type: ignore[arg-type]
    total = domain_taken + sum(taken.values())
    if total < cfg.sentence_budget and not cfg.allow_shortfall:
        raise InputError(", ".join(sorted({s.source for s in shards})),
                         f"mixer mdapt: the corpora hold only {total} sentences (after never repeating a "
                         f"page across languages) for a budget of {cfg.sentence_budget}",
                         expected="a smaller mixer.sentence_budget, more text, or mixer.allow_shortfall=true")
    probabilities = smoothed_probabilities(sizes, cfg.alpha)
    notes = {"mixer": "mdapt", "budget": cfg.sentence_budget, "alpha": cfg.alpha,
             "domain_sentences": dict(domain_by_lang), "general_quota": quotas, "general_sentences": taken,
             "probabilities": probabilities, "total_sentences": total,
             "languages": language_table(domain_by_lang, sizes, probabilities, remaining, available, quotas, taken,
                                          from_domain)}
    if from_domain:
        notes["upsample_from_domain"] = sorted(from_domain)
    if named:
        notes["upsample_sources"] = sorted(named)
    return MixPlan(tuple(_units_from_refs(refs, shards, cfg)), notes)


def weighted_bytes(sizes: dict[str, int], weights: dict[str, float], total: int) -> dict[str, int]:
    """Bytes each source is to feed: ``total`` split by the normalised weights (rounded down)."""
    norm = sum(weights.get(name, 0.0) for name in sizes)
    return {name: int(total * weights.get(name, 0.0) / norm) for name in sizes}


@MIXERS.register("weighted")
def weighted(shards: Sequence[ShardInfo], cfg: MixerConfig, rng: random.Random) -> MixPlan:
    """Explicit weights: source i feeds ``w_i / sum(w) x total_bytes`` bytes of text to instance creation.

    A source needing r times its own size gets every shard ``floor(r)`` times (one unit per shard, that
    dupe factor, fresh masks each pass, as conventional mixing repeats) and, for the fraction left,
    documents drawn at random without replacement until their bytes reach it (one unit per shard they
    come from, dupe factor 1). A source's share is therefore exact up to one document. NSP pairs stay
    inside a shard, as in conventional mixing. ``total_bytes`` 0: the sources' total size x dupe_factor.
    """
    sizes: dict[str, int] = defaultdict(int)
    for s in shards:
        sizes[s.source] += s.n_bytes
    missing = sorted(set(sizes) - set(cfg.weights))
    if missing:
        raise ConfigError(f"mixer weighted: no weight for source {missing[0]!r} (mixer.weights names "
                          f"{sorted(cfg.weights)}); give every source a weight, 0 to leave it out")
    total = cfg.total_bytes or sum(sizes.values()) * cfg.dupe_factor
    target = weighted_bytes(dict(sizes), cfg.weights, total)
    units: list[Unit] = []
    passes: dict[str, float] = {}
    for name in sizes:  # shard order: the sources' order in the config
        mine = [s for s in shards if s.source == name]
        if target[name] <= 0:
            passes[name] = 0.0
            continue
        full, rest = divmod(target[name], sizes[name])
        passes[name] = round(target[name] / sizes[name], 4)
        if full:
            for s in mine:  # one unit a shard, each its own id (a comprehension gave them one)
                units.append(Unit(len(units), (Member(s.path),), full))
        docs = [(s, row) for s in mine for row in range(s.n_docs)]
        rng.shuffle(docs)
        picked: dict[str, list[int]] = defaultdict(list)
        got = 0
        for s, row in docs:
            if got >= rest:
                break
            picked[s.path].append(row)
            got += s.doc_bytes[row]
        for s in mine:
            if s.path in picked:
                rows = tuple(sorted(picked[s.path]))
                units.append(Unit(len(units), (Member(s.path, None if len(rows) == s.n_docs else rows),), 1))
    norm = sum(cfg.weights.get(n, 0.0) for n in sizes)
    notes = {"mixer": "weighted", "total_bytes": total,
             "weights": {n: round(cfg.weights.get(n, 0.0) / norm, 6) for n in sizes},
             "target_bytes": target, "passes": passes}
    return MixPlan(tuple(units), notes)
def language_table(domain: dict[str, int], sizes: dict[str, int], smoothed: dict[str, float], remaining: int,
                   available: dict[str, int], quotas: dict[str, int], taken: dict[str, int],
                   from_domain: set[str]) -> dict[str, dict]:
    """Per language, what the manifest reports: the domain sentences taken whole, P(L) and its smoothed
    q(L), the smoothed target ``remaining x q(L)`` of the up-sampling budget, the quota (the target
    rounded to whole sentences; ``capped`` when the language has fewer sentences than its target, whose
    excess then went to the others), and the sentences up-sampled (whole documents, so up to one
    document above the quota) and from where."""
    total_size = sum(sizes.values()) or 1
    out = {}
    for lang in sorted(set(domain) | set(sizes)):
        up = taken.get(lang, 0)
        q = smoothed.get(lang, 0.0)
        out[lang] = {"domain": domain.get(lang, 0), "p": round(sizes.get(lang, 0) / total_size, 6),
                     "q": round(q, 6), "target": round(remaining * q, 2), "quota": quotas.get(lang, 0),
                     "capped": available.get(lang, 0) < remaining * q, "upsampled": up,
                     "upsampled_from": "domain" if lang in from_domain else "general",
                     "total": domain.get(lang, 0) + up}
    return out
