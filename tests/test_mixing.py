"""Mixing plans as pure functions: conventional keeps size shares, SimPT balances, MDAPT smooths languages."""
from __future__ import annotations

import random

import pytest

from orchestrator.core.artifacts import ShardInfo
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.corpus.mixing import (
    MIXERS,
    MixerConfig,
    allocate_budget,
    fill_quotas,
    planned_bytes,
    select_pages,
    smoothed_probabilities,
)


def _shards(source: str, role: str, n: int, size: int = 1000, language: str = "en", docs: int = 4,
            pages: list[str] | None = None) -> list[ShardInfo]:
    out = []
    for i in range(n):
        page_ids = tuple(pages[i * docs:(i + 1) * docs]) if pages else tuple(f"{source}{i}.{j}" for j in range(docs))
        out.append(ShardInfo(path=f"{source}/shard-{i}.parquet", source=source, role=role, language=language,
                             n_bytes=size, pages=page_ids, doc_sentences=(10,) * docs,
                             doc_bytes=(size // docs,) * docs))
    return out


def _share(plan, shards, source):
    planned = planned_bytes(plan, shards)
    return planned.get(source, 0) / sum(planned.values())


def test_conventional_keeps_size_share_simpt_gives_half():
    shards = _shards("pubmed", "small", 4) + _shards("wiki", "large", 36)
    conv = MIXERS.get("conventional")(shards, MixerConfig(name="conventional", dupe_factor=5), random.Random(0))
    simpt = MIXERS.get("simpt")(shards, MixerConfig(name="simpt", shards_per_side=10), random.Random(0))
    assert _share(conv, shards, "pubmed") == pytest.approx(0.1)
    assert _share(simpt, shards, "pubmed") == pytest.approx(0.5)
    assert all(u.dupe_factor == 5 and len(u.members) == 1 for u in conv.units)
    # k shrinks to the 4 small shards; 36 large shards / 4 per unit x dupe_factor 5 units
    assert simpt.notes["k"] == 4 and len(simpt.units) == 9 * 5
    assert all(len({m.path for m in u.members}) == len(u.members) == 8 for u in simpt.units)


def test_simpt_balances_bytes_when_large_shards_are_bigger():
    shards = _shards("pubmed", "small", 10, size=1000) + _shards("wiki", "large", 10, size=2500)
    plan = MIXERS.get("simpt")(shards, MixerConfig(name="simpt", shards_per_side=4, units=50), random.Random(1))
    assert 0.4 < _share(plan, shards, "pubmed") <= 0.5
    assert len(plan.units) == 50


def test_simpt_is_seeded():
    shards = _shards("a", "small", 12) + _shards("b", "large", 30)
    cfg = MixerConfig(name="simpt", shards_per_side=5)
    one = MIXERS.get("simpt")(shards, cfg, random.Random(3))
    two = MIXERS.get("simpt")(shards, cfg, random.Random(3))
    three = MIXERS.get("simpt")(shards, cfg, random.Random(4))
    assert one == two and one != three


def test_smoothed_probabilities_flatten_towards_uniform():
    q = smoothed_probabilities({"en": 900, "de": 90, "da": 10}, 0.3)
    assert sum(q.values()) == pytest.approx(1.0)
    assert q["en"] < 0.9 and q["da"] > 0.01  # alpha < 1 up-samples the small language
    assert q["en"] > q["de"] > q["da"]
    assert smoothed_probabilities({"en": 900, "de": 100}, 1.0) == pytest.approx({"en": 0.9, "de": 0.1})
    # Known answer: 0.9^0.3 / (0.9^0.3 + 0.1^0.3)
    assert smoothed_probabilities({"en": 900, "de": 100}, 0.3)["en"] == pytest.approx(0.9**0.3 / (0.9**0.3 + 0.1**0.3))


def test_allocate_budget_caps_and_redistributes():
    quotas = allocate_budget(1000, {"en": 10_000, "de": 5_000, "da": 20}, 0.3)
    assert sum(quotas.values()) == 1000
    assert quotas["da"] == 20  # capped at what exists, the excess went to the others
    assert quotas["en"] > quotas["de"] > 0
    assert allocate_budget(10_000, {"en": 100, "de": 50}, 0.3) == {"en": 100, "de": 50}


def test_select_pages_never_repeats_a_page_across_languages():
    pages = [f"p{i}" for i in range(20)]
    cands = {lang: [(p, 5, (lang, p)) for p in pages] for lang in ("en", "de", "es")}
    chosen, taken = select_pages(cands, {"en": 30, "de": 30, "es": 30}, random.Random(0))
    used = [ref[1] for refs in chosen.values() for ref in refs]
    assert len(used) == len(set(used)) == 18
    assert taken == {"en": 30, "de": 30, "es": 30}


def test_select_pages_lets_a_language_take_the_other_paragraphs_of_its_own_page():
    """A page is one language's once taken; that language may take its other documents (SQuAD-style
    paragraphs share their article's title), the others may not."""
    cands = {"de": [(f"A{i // 4}", 5, ("de", i)) for i in range(8)],  # 2 pages x 4 paragraphs
             "ru": [(f"A{i // 4}", 5, ("ru", i)) for i in range(8)]}
    chosen, taken = select_pages(cands, {"de": 40, "ru": 40}, random.Random(0))
    assert taken == {"de": 20, "ru": 20}  # each language one whole page, none of the other's
    pages = {lang: {ref[1] // 4 for ref in refs} for lang, refs in chosen.items()}
    assert len(pages["de"]) == len(pages["ru"]) == 1 and pages["de"] != pages["ru"]


def test_mdapt_fills_budget_domain_first_then_smoothed_general():
    shards = (_shards("pm_en", "domain", 2, language="en") + _shards("pm_de", "domain", 1, language="de")
              + _shards("wiki_en", "general", 20, language="en", pages=[f"P{i}" for i in range(80)])
              + _shards("wiki_de", "general", 5, language="de", pages=[f"P{i}" for i in range(20)]))
    cfg = MixerConfig(name="mdapt", sentence_budget=500, alpha=0.3, dupe_factor=2)
    plan = MIXERS.get("mdapt")(shards, cfg, random.Random(0))
    notes = plan.notes
    assert notes["domain_sentences"] == {"en": 80, "de": 40}
    assert sum(notes["general_sentences"].values()) + 120 >= 500
    assert notes["general_quota"]["en"] > notes["general_quota"]["de"] > 0
    # P(de) = 0.2 -> smoothed up
    assert notes["general_quota"]["de"] / sum(notes["general_quota"].values()) > 0.2
    by_path = {s.path: s for s in shards}
    chosen_pages = [by_path[m.path].pages[r] for u in plan.units for m in u.members
                    if by_path[m.path].role == "general" for r in (m.rows or range(by_path[m.path].n_docs))]
    assert len(chosen_pages) == len(set(chosen_pages))
    assert all(u.dupe_factor == 2 for u in plan.units)


def test_mdapt_budget_larger_than_corpus_is_an_error_unless_allowed():
    shards = _shards("pm", "domain", 1) + _shards("wiki", "general", 1)
    with pytest.raises(InputError, match="budget"):
        MIXERS.get("mdapt")(shards, MixerConfig(name="mdapt", sentence_budget=10_000), random.Random(0))
    plan = MIXERS.get("mdapt")(shards, MixerConfig(name="mdapt", sentence_budget=10_000, allow_shortfall=True),
                               random.Random(0))
    assert plan.notes["total_sentences"] == 80


def test_unknown_mixer_suggests_the_closest():
    with pytest.raises(ConfigError, match="simpt"):
        MixerConfig(name="simpy")


def _multilingual() -> list[ShardInfo]:
    """Domain text: 40 sentences each in de and fr, 400 in en; general text: 800 de, 200 fr, 1600 en
    (pages shared across languages, as parallel Wikipedia titles)."""
    return (_shards("pm_de", "domain", 1, language="de") + _shards("pm_fr", "domain", 1, language="fr")
            + _shards("pm_en", "domain", 10, language="en")
            + _shards("wiki_de", "general", 20, language="de", pages=[f"P{i}" for i in range(80)])
            + _shards("wiki_fr", "general", 5, language="fr", pages=[f"P{i}" for i in range(20)])
            + _shards("wiki_en", "general", 40, language="en", pages=[f"P{i}" for i in range(160)]))


def test_weights_given_to_a_mixer_that_does_not_weigh_are_refused_as_upsample_from_domain_is():
    """mixer.weights beside name simpt was ignored without a word (upsample_from_domain there was refused)."""
    with pytest.raises(ConfigError, match=r"^mixer.weights is a weighted setting; mixer 'simpt' sets each source's "):
        MixerConfig(name="simpt", weights={"pubmed": 1.0})
    assert MixerConfig(name="weighted", weights={"pubmed": 1.0}).weights == {"pubmed": 1.0}
    with pytest.raises(ConfigError, match=r"^mixer.total_bytes is a weighted setting; mixer 'conventional' "):
        MixerConfig(name="conventional", total_bytes=10_000)  # ignored without a word too
    assert MixerConfig(name="weighted", weights={"pubmed": 1.0}, total_bytes=10_000).total_bytes == 10_000


def test_mdapt_upsamples_english_from_domain_text_to_its_smoothed_target():
    """Seed 002, 'Except for English, we up-sample using Wikipedia data': with upsample_from_domain [en],
    English domain text is not taken whole first (without the option it fills 400 of the 500 sentences),
    and English gets its smoothed share of the budget left after de and fr domain text, from PubMed."""
    shards = _multilingual()
    plain = MIXERS.get("mdapt")(shards, MixerConfig(name="mdapt", sentence_budget=500), random.Random(0))
    assert plain.notes["domain_sentences"] == {"de": 40, "fr": 40, "en": 400}
    assert plain.notes["languages"]["en"]["total"] >= 400 and "upsample_from_domain" not in plain.notes

    cfg = MixerConfig(name="mdapt", sentence_budget=500, alpha=0.3, upsample_from_domain=("en",))
    plan = MIXERS.get("mdapt")(shards, cfg, random.Random(0))
    langs = plan.notes["languages"]
    assert plan.notes["domain_sentences"] == {"de": 40, "fr": 40}
    # Known answer: P(L) from the general text 800 : 200 : 1600; q = P^0.3 normalised; 420 sentences left
    assert {k: v["q"] for k, v in langs.items()} == pytest.approx({"de": 0.345913, "fr": 0.228218, "en": 0.425869},
                                                                   abs=1e-6)
    assert {k: v["target"] for k, v in langs.items()} == pytest.approx({"de": 145.28, "fr": 95.85, "en": 178.87})
    assert {k: v["quota"] for k, v in langs.items()} == {"de": 145, "fr": 96, "en": 179}
    assert not any(v["capped"] for v in langs.values())
    # whole documents of 10 sentences: at most one document past the quota
    for v in langs.values():
        assert v["quota"] <= v["upsampled"] < v["quota"] + 10 and abs(v["quota"] - v["target"]) < 1
    assert langs["en"]["upsampled_from"] == "domain" and langs["de"]["upsampled_from"] == "general"
    assert {k: v["total"] for k, v in langs.items()} == {"de": 190, "fr": 140, "en": 180}
    sources = {m.path.split("/")[0] for u in plan.units for m in u.members}
    assert sources == {"pm_de", "pm_fr", "pm_en", "wiki_de", "wiki_fr"}  # no English Wikipedia
    assert plan.notes["upsample_from_domain"] == ["en"]


def test_upsample_from_domain_without_general_text_uses_the_pool_size_and_is_mdapt_only():
    shards = [s for s in _multilingual() if s.source != "wiki_en"]
    plan = MIXERS.get("mdapt")(shards, MixerConfig(name="mdapt", sentence_budget=500, upsample_from_domain=("en",)),
                               random.Random(0))
    assert plan.notes["languages"]["en"]["p"] == pytest.approx(400 / 1400, abs=1e-6)  # its 400 domain sentences
    with pytest.raises(ConfigError, match="mdapt setting"):
        MixerConfig(name="simpt", upsample_from_domain=("en",))
    with pytest.raises(ConfigError, match="once"):
        MixerConfig(name="mdapt", upsample_from_domain=("en", "en"))


def _compositions() -> dict[str, tuple[list[ShardInfo], MixerConfig]]:
    """Seed 002's three corpora (Section 3.2), as experiments/mdapt_compositions.yaml composes them,
    on a 1,000-sentence budget: M_D 60 de + 40 fr + 20 en (WMT / PubMed titles and abstracts), E_D 2,000
    English abstracts, M_WIKI 800 de, 320 fr and 1,600 en sentences (de and en pages parallel)."""
    m_d = (_shards("m_d_de", "domain", 3, language="de", docs=2) + _shards("m_d_fr", "domain", 2, language="fr", docs=2)
           + _shards("m_d_en", "domain", 1, language="en", docs=2))
    e_d = _shards("e_d", "domain", 50, language="en")
    wiki = (_shards("wiki_de", "general", 20, language="de", pages=[f"P{i}" for i in range(80)])
            + _shards("wiki_fr", "general", 8, language="fr", pages=[f"F{i}" for i in range(32)])
            + _shards("wiki_en", "general", 40, language="en", pages=[f"P{i}" for i in range(160)]))
    budget = {"name": "mdapt", "sentence_budget": 1000, "alpha": 0.3}
    return {"E_D": (e_d, MixerConfig(**budget)),
            "M_D+E_D": (m_d + e_d, MixerConfig(**budget)),
            "M_D+M_WIKI": (m_d + e_d + wiki, MixerConfig(**budget, upsample_from_domain=("en",),
                                                          upsample_sources=("e_d",)))}


def _sentences_by(plan, shards) -> dict[tuple[str, str], int]:
    """(source, language) -> sentences the plan feeds once (dupe factor not counted)."""
    by_path = {s.path: s for s in shards}
    out: dict[tuple[str, str], int] = {}
    for unit in plan.units:
        for m in unit.members:
            s = by_path[m.path]
            n = sum(s.doc_sentences[r] for r in (m.rows if m.rows is not None else range(s.n_docs)))
            out[(s.source, s.language)] = out.get((s.source, s.language), 0) + n
    return out


def test_seed002_compositions_have_the_languages_and_shares_of_the_recipe():
    """E_D: English domain text to the budget. M_D+E_D: all of M_D, English domain text for the rest.
    M_D+M_WIKI: all of M_D (its English too), the 880 sentences left split by P(L)^0.3 over the general
    text's 800 : 320 : 1600, de and fr from Wikipedia, en from E_D's abstracts; no English Wikipedia."""
    plans = {name: (MIXERS.get("mdapt")(shards, cfg, random.Random(0)), shards)
             for name, (shards, cfg) in _compositions().items()}
    got = {name: _sentences_by(plan, shards) for name, (plan, shards) in plans.items()}

    assert got["E_D"] == {("e_d", "en"): 1000}
    assert got["M_D+E_D"] == {("m_d_de", "de"): 60, ("m_d_fr", "fr"): 40, ("m_d_en", "en"): 20, ("e_d", "en"): 880}

    mwiki, shards = plans["M_D+M_WIKI"]
    q = smoothed_probabilities({"de": 800, "fr": 320, "en": 1600}, 0.3)
    langs = mwiki.notes["languages"]
    assert {k: v["domain"] for k, v in langs.items()} == {"de": 60, "fr": 40, "en": 20}  # M_D whole
    assert {k: v["target"] for k, v in langs.items()} == pytest.approx({k: round(880 * q[k], 2) for k in q})
    assert {k: v["quota"] for k, v in langs.items()} == {"de": 294, "fr": 224, "en": 362}  # the targets, rounded
    mix = got["M_D+M_WIKI"]
    assert set(mix) == {("m_d_de", "de"), ("m_d_fr", "fr"), ("m_d_en", "en"), ("e_d", "en"), ("wiki_de", "de"),
                        ("wiki_fr", "fr")}
    for lang, source in (("de", "wiki_de"), ("fr", "wiki_fr"), ("en", "e_d")):
        assert langs[lang]["quota"] <= mix[(source, lang)] < langs[lang]["quota"] + 10  # whole 10-sentence docs
    assert 1000 <= sum(mix.values()) < 1000 + 30
    general = sum(n for (src, _), n in mix.items() if src.startswith("wiki"))
    assert general / sum(mix.values()) == pytest.approx((880 * (q["de"] + q["fr"])) / 1000, abs=0.02)
    assert mwiki.notes["upsample_sources"] == ["e_d"]


def test_upsample_sources_must_be_domain_sources_of_an_upsampled_language():
    from orchestrator.core.config import from_dict
    from orchestrator.corpus.stage import CorpusConfig

    sources = [{"name": "m_d_en", "paths": ["a"], "role": "domain"}, {"name": "e_d", "paths": ["b"], "role": "domain"},
               {"name": "wiki", "paths": ["c"], "role": "general", "language": "de"}]

    def corpus(**mixer):
        return from_dict(CorpusConfig, {"sources": sources, "mixer": {"name": "mdapt", **mixer}})

    assert corpus(upsample_from_domain=["en"], upsample_sources=["e_d"]).mixer.upsample_sources == ("e_d",)
    with pytest.raises(ConfigError, match="needs mixer.upsample_from_domain"):
        corpus(upsample_sources=["e_d"])
    with pytest.raises(ConfigError, match="'wiki' is not a source with role domain"):
        corpus(upsample_from_domain=["de"], upsample_sources=["wiki"])
    with pytest.raises(ConfigError, match="'e_d' is en text"):
        corpus(upsample_from_domain=["de"], upsample_sources=["e_d"])


def test_a_language_short_of_pages_passes_its_excess_to_the_others():
    """de and ru share 10 parallel pages (10 sentences each), so each gets about half; what they cannot
    fill goes to en (its own pages), and the budget is met instead of falling short."""
    cands = {"de": [(f"P{i}", 10, ("de", i)) for i in range(10)], "ru": [(f"P{i}", 10, ("ru", i)) for i in range(10)],
             "en": [(f"E{i}", 10, ("en", i)) for i in range(100)]}
    available = {lang: sum(c[1] for c in cs) for lang, cs in cands.items()}
    sizes = {"de": 100, "ru": 100, "en": 100}
    quotas, chosen, taken, final = fill_quotas(cands, 300, available, 0.3, sizes, random.Random(0))
    assert sum(taken.values()) == 300 and taken["de"] + taken["ru"] == 100
    assert final["de"] == taken["de"] < 100 and final["en"] == 1000 and quotas["en"] == 200
    once = select_pages(cands, allocate_budget(300, available, 0.3, sizes), random.Random(0))[1]
    assert sum(once.values()) == 200  # one round of quotas alone falls short
