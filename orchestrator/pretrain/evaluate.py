"""MLM accuracy of a pretrained model on fixed instances: one yardstick for models trained on
differently masked instances (the cycles of ``orchestrator.workflows.entity_cycle``: a cycle's training accuracy is
on its own, entity-masked, instances and says nothing across cycles).

    evaluate_mlm(model_dir, instances_dir, max_instances=512)
        -> {"mlm_accuracy", "mlm_loss", "masked", "instances"}

The instances' static masks are the targets (the first ``max_instances`` rows, parquet parts in
name order), so every model is scored on the same positions. Runs in the driver, on CPU.
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.instances.config import Specials
from orchestrator.pretrain.data import collate

COLUMNS = ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_label")


def read_rows(instances_dir: Path, max_instances: int) -> dict[str, list]:
    """The first ``max_instances`` rows of an instances directory, column -> values."""
    import pyarrow.parquet as pq  # heavy: pyarrow

    rows: dict[str, list] = {c: [] for c in COLUMNS}
    for part in sorted(Path(instances_dir).glob("part-*.parquet")):
        table = pq.read_table(part, columns=list(COLUMNS)).slice(0, max_instances - len(rows["input_ids"]))
        for c in COLUMNS:
            rows[c].extend(table.column(c).to_pylist())
        if len(rows["input_ids"]) >= max_instances:
            break
    if not rows["input_ids"]:
        raise InputError(instances_dir, "no instances to evaluate on", expected="part-*.parquet files")
    if not any(rows["masked_lm_positions"]):
        raise InputError(instances_dir, "instances carry no masks (dynamic masking)", expected="static masking")
    return rows


def evaluate_mlm(model_dir: str | Path, instances_dir: str | Path, max_instances: int = 512,
                 batch_size: int = 64) -> dict:
    import torch  # heavy: torch, transformers
    from transformers import AutoModelForPreTraining, AutoTokenizer

    from orchestrator.modeling.encoder import from_pretrained
    from orchestrator.pretrain.model import PretrainingModule  # heavy: torch, transformers
    from orchestrator.pretrain.unpad import unpad_refusal

    special = Specials.from_tokenizer(AutoTokenizer.from_pretrained(str(model_dir)))
    model = from_pretrained(AutoModelForPreTraining, model_dir)
    # the encoder on the real tokens only (pretrain.speed.unpad's path), where the model allows it
    module = PretrainingModule(model, unpad=unpad_refusal(model.bert) is None).eval()
    rows = read_rows(Path(instances_dir), max_instances)
    n = len(rows["input_ids"])
    correct = count = loss = 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            batch = collate({c: v[start:start + batch_size] for c, v in rows.items()}, special, indices=True)
            out = module(**{k: torch.from_numpy(v) for k, v in batch.items()})
            correct += float(out["mlm_correct"])
            count += float(out["mlm_count"])
            loss += float(out["mlm_loss"]) * float(out["mlm_count"])
    return {"mlm_accuracy": correct / max(count, 1.0), "mlm_loss": loss / max(count, 1.0), "masked": int(count),
            "instances": n}
