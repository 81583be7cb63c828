"""A fine-tuned TaskModel as a Hugging Face directory, and back: the sweep's exported models.

    save_finetuned(model, spec, tokenizer, out_dir)      # into a directory being written
    tagger = load_token_classifier(out_dir)              # an exported NER model
    tagger.tag(["Naloxone reverses the effect of clonidine ."])
        -> [[("Naloxone", "B-Chemical"), ("reverses", "O"), ...]]
    entity_spans(tagged) -> [[("Naloxone", "Chemical"), ("clonidine", "Chemical")]]

Files: the encoder (``config.json`` with ``id2label`` / ``label2id``, ``model.safetensors``; a model
with adapters also ``adapters.safetensors`` + ``adapter_config.json``), the tokenizer files, the task
head (``head.safetensors``) and ``task.json`` (the task definition, the length limit inputs were cut
to). Weights are safetensors only: nothing here unpickles a file. The manifest beside them is the
caller's (``orchestrator.sweep.export`` writes what trial the model comes from and its scores).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from orchestrator.core.artifacts import limit_tokenizer, usable_positions, write_vocab_txt
from orchestrator.core.config import from_dict, to_dict
from orchestrator.core.manifest import atomic_write_text, is_complete
from orchestrator.finetune.model import TaskModel
from orchestrator.finetune.readers import Example
from orchestrator.finetune.spec import TaskSpec
from orchestrator.instances.entities import EXPORT_HEAD

HEAD_WEIGHTS = EXPORT_HEAD  # the masking stage's NerExtractor loads an export's head by this name
TASK_FILE = "task.json"


def save_finetuned(model: TaskModel, spec: TaskSpec, tokenizer, out_dir: Path, max_seq_length: int) -> None:
    """Write ``model`` (encoder, head), its tokenizer and its task into ``out_dir``."""
    from safetensors.torch import save_file  # heavy: safetensors

    from orchestrator.modeling.adapters import has_adapters, save_adapters  # heavy: transformers

    out_dir = Path(out_dir)
    encoder = model.encoder
    if spec.labels and spec.family != "sts":
        encoder.config.id2label = dict(enumerate(spec.labels))
        encoder.config.label2id = {label: i for i, label in enumerate(spec.labels)}
    else:
        encoder.config.num_labels = 1
    if spec.family != "ner":  # what the labels are, for a reader of the config (the head is head.safetensors')
        encoder.config.problem_type = PROBLEM_TYPES.get(spec.family, "single_label_classification")
    encoder.config.finetuning_task = spec.name
    state = {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items() if ".adapter." not in k}
    head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
    whole = spec.family == "ner" and not has_adapters(encoder)  # BertForTokenClassification computes this model
    if whole:
        state = {**{f"bert.{k}": v for k, v in state.items()}, **{f"classifier.{k}": v for k, v in head.items()}}
    encoder.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
    if whole:  # save_pretrained names the class it was called on
        config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
        atomic_write_text(out_dir / "config.json", json.dumps({**config, "architectures": [TOKEN_CLASSIFIER]},
                                                              indent=2, sort_keys=True) + "\n")
    if has_adapters(encoder):
        save_adapters(encoder, out_dir)
    tokenizer.save_pretrained(str(out_dir))
    backend = getattr(tokenizer, "backend_tokenizer", None)  # transformers 5 saves a WordPiece's tokenizer.json alone
    if not (out_dir / "vocab.txt").is_file() and backend is not None and \
            json.loads(backend.to_str()).get("model", {}).get("type") == "WordPiece":
        write_vocab_txt(out_dir, tokenizer.get_vocab())
    limit_tokenizer(out_dir, usable_positions(encoder.config.to_dict()) or encoder.config.max_position_embeddings)
    save_file(head, str(out_dir / HEAD_WEIGHTS))
    atomic_write_text(out_dir / "README.md", model_card(spec, whole))
    (out_dir / TASK_FILE).write_text(json.dumps({"task": to_dict(spec), "max_seq_length": max_seq_length},
                                                indent=2, sort_keys=True) + "\n", encoding="utf-8")


#: A task family's transformers ``problem_type`` (NER's model is a BertForTokenClassification, which needs none)
PROBLEM_TYPES = {"sts": "regression", "multilabel": "multi_label_classification"}
TOKEN_CLASSIFIER = "BertForTokenClassification"


def model_card(spec: TaskSpec, whole: bool) -> str:
    """The export's README.md: how to load it, in this project and in plain transformers."""
    decode = {"sts": "the score is the logit", "multilabel": "a label is on where sigmoid(logit) > 0.5",
              "ner": "a word's tag is its first sub-token's argmax"}.get(spec.family, "the label is the argmax")
    plain = (f"`AutoModelForTokenClassification.from_pretrained(dir)` loads it whole ({TOKEN_CLASSIFIER}: the encoder "
             "and its classifier); config.json's id2label names the tags." if whole else
             "The task head reads the [CLS] token's last hidden state (no pooler), so "
             "`AutoModelForSequenceClassification` / `AutoModelForTokenClassification` would put a new, randomly "
             "initialised classifier on top: do not use them. In plain PyTorch:\n\n"
             "```python\nimport torch\nfrom safetensors.torch import load_file\n"
             "from transformers import AutoModel, AutoTokenizer\n\n"
             "tokenizer, encoder = AutoTokenizer.from_pretrained(d), AutoModel.from_pretrained(d).eval()\n"
             "head = load_file(f\"{d}/head.safetensors\")  # weight [outputs, hidden], bias [outputs]\n"
             "with torch.no_grad():\n"
             "    states = encoder(**tokenizer(texts, padding=True, truncation=True, return_tensors=\"pt\"))"
             ".last_hidden_state\n"
             "logits = torch.nn.functional.linear(states" + ("" if spec.family == "ner" else "[:, 0]")
             + ", head[\"weight\"], head[\"bias\"])\n```\n\n"
             "(a model with adapters: load it with the project's loader, which adds them)")
    return (f"# {spec.name}: a fine-tuned model exported by the sweep\n\n"
            f"Task family {spec.family}, metric {spec.metric}; {decode}. Inputs were cut to the length in "
            "task.json.\n\n"
            "With this project: `from orchestrator.finetune.export import load_finetuned; "
            "load_finetuned(dir).predict(examples)` (the sweep's own decoding).\n\n"
            f"With plain transformers: {plain}\n")


@dataclasses.dataclass
class FineTuned:
    """An exported model, ready to predict: the TaskModel, its tokenizer and its task."""

    model: TaskModel
    tokenizer: Any
    spec: TaskSpec
    max_seq_length: int
    device: torch.device

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.spec.labels))

    def predict(self, examples: Sequence[Example], batch_size: int = 32) -> list[Any]:
        """Predictions in the task's label space, decoded as the sweep decodes them (``loop.predict``)."""
        from orchestrator.finetune.encoding import encode  # heavy: torch
        from orchestrator.finetune.loop import predict  # heavy: transformers (through loop)

        enc = encode(self.spec, list(examples), self.tokenizer, self.max_seq_length)
        return predict(self.model, self.spec, enc, batch_size, self.tokenizer.pad_token_id or 0, self.device)

    def tag(self, sentences: Sequence[str | Sequence[str]], batch_size: int = 32) -> list[list[tuple[str, str]]]:
        """NER: each sentence's (word, tag) pairs. A sentence is a list of words, or a string split on
        whitespace (BLUE's NER files are tokenised so: punctuation as words of its own). Words past
        ``max_seq_length`` word pieces are tagged O, as in the sweep's scoring."""
        if self.spec.family != "ner":
            raise ValueError(f"{self.spec.name} is a {self.spec.family} task: tag() is for NER models")
        words = [s.split() if isinstance(s, str) else list(s) for s in sentences]
        examples = [Example(id=str(i), text_a=w, label=["O"] * len(w)) for i, w in enumerate(words)]
        return [list(zip(w, tags)) for w, tags in zip(words, self.predict(examples, batch_size))]


def load_finetuned(path: str | Path, device: str = "cpu") -> FineTuned:
    """An exported model directory (``save_finetuned`` plus a manifest) back into a ``FineTuned``.
    A directory without its manifest is an export that never finished, and is refused."""
    from safetensors.torch import load_file  # heavy: safetensors
    from transformers import AutoTokenizer  # heavy: transformers

    path = Path(path)
    if not is_complete(path) or not (path / TASK_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a finished model export (no manifest.json or {TASK_FILE})")
    meta = json.loads((path / TASK_FILE).read_text(encoding="utf-8"))
    spec = from_dict(TaskSpec, meta["task"], where=str(path / TASK_FILE))
    model = TaskModel(path, spec, use_safetensors=True)
    model.head.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
    dev = torch.device(device)
    model.to(dev).eval()
    return FineTuned(model=model, tokenizer=AutoTokenizer.from_pretrained(str(path)), spec=spec,
                     max_seq_length=int(meta["max_seq_length"]), device=dev)


def load_token_classifier(path: str | Path, device: str = "cpu") -> FineTuned:
    """An exported NER model (the masking stage's entity extractor): ``load_finetuned`` that refuses
    any other task family."""
    tuned = load_finetuned(path, device)
    if tuned.spec.family != "ner":
        raise ValueError(f"{path} holds a {tuned.spec.family} model ({tuned.spec.name}), not a token classifier")
    return tuned


def entity_spans(tagged: Sequence[Sequence[tuple[str, str]]]) -> list[list[tuple[str, str]]]:
    """IOB-tagged words -> each sentence's entities as (text, type), words joined by a space. An
    I- tag that does not continue an entity of its type starts one (seqeval's lenient reading)."""
    out = []
    for sentence in tagged:
        spans: list[tuple[list[str], str]] = []
        current: tuple[list[str], str] | None = None
        for word, tag in sentence:
            prefix, _, kind = tag.partition("-")
            if prefix == "I" and current is not None and current[1] == kind:
                current[0].append(word)
            elif prefix in ("B", "I"):
                current = ([word], kind)
                spans.append(current)
            else:
                current = None
        out.append([(" ".join(words), kind) for words, kind in spans])
    return out
