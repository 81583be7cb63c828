"""A task whose public release has one split (ChemProt's dev file) is re-split by document, through
its task YAML: the same split for every trial, no document in two splits."""
from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.finetune.loop import load_splits
from orchestrator.finetune.readers import Example, document_split
from orchestrator.finetune.spec import TaskSpec, load_task
from orchestrator.finetune.trial import TrialSpec

SHARES = {"train": 0.7, "dev": 0.1, "test": 0.2}


def test_document_split_keeps_each_document_in_one_split_and_cuts_by_share():
    examples = [Example(id=f"{doc}.T{i}.T{i + 1}", text_a="x", label="false") for doc in range(100) for i in range(3)]
    splits = document_split(examples, SHARES, ".", seed=0)
    docs = {name: {ex.id.split(".")[0] for ex in part} for name, part in splits.items()}
    assert {name: len(d) for name, d in docs.items()} == {"train": 70, "dev": 10, "test": 20}
    assert not (docs["train"] & docs["dev"] or docs["train"] & docs["test"] or docs["dev"] & docs["test"])
    assert sum(len(p) for p in splits.values()) == 300
    assert document_split(examples, SHARES, ".", seed=0) == splits  # the same on every call
    assert document_split(examples, SHARES, ".", seed=1) != splits


@pytest.mark.parametrize("files, resplit, message", [
    ({"train": "a"}, SHARES, "resplit needs files.all"),
    ({"all": "a"}, {"train": 0.7, "test": 0.3}, "exactly train, dev and test"),
    ({"all": "a"}, {"train": 0.7, "dev": 0.2, "test": 0.2}, "sum to 1"),
])
def test_bad_resplit_settings_are_refused(files, resplit, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TaskSpec(name="T", family="re", metric="micro_f1_positive", group="biomedical", files=files,
                 resplit=resplit, labels=("a", "false"))


def test_chemprot_dev_file_is_resplit_by_abstract(shared_data, tmp_path):
    spec = dataclasses.replace(load_task("chemprot_resplit"), dir="")
    assert spec.file_splits == ("all",)
    trial = TrialSpec(trial_id="t", model_name="m", model_dir="", task="chemprot",
                      data_dir=str(shared_data / "chemprot"),
                      learning_rate=1e-3, seed=1, eval_epochs=(1,), batch_size=8, max_seq_length=64,
                      max_train_examples=0, max_eval_examples=0)
    splits = load_splits(spec, trial)
    pmids = {name: {ex.id.split(".")[0] for ex in part} for name, part in splits.items()}
    assert sum(len(p) for p in splits.values()) == 11268  # every row of the public dev file, once
    assert not (pmids["train"] & pmids["test"] or pmids["dev"] & pmids["test"] or pmids["train"] & pmids["dev"])
    assert round(len(pmids["train"]) / sum(map(len, pmids.values())), 2) == 0.7
    assert load_splits(spec, trial)["test"] == splits["test"]
