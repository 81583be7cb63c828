"""Which pretrained weights cost the ablation's arms their NER score: embeddings or encoder?

    python benchmarks/ablation_diagnosis.py --run-dir <runs_root>/oubiobert_ablation [--arm conventional]

Takes an arm's pretrained model and the experiment's untrained floor (same architecture, same
vocabulary) from ``experiment.json`` and writes three hybrids: the pretrained encoder with the
floor's word/position/type embeddings (``emb_random``), the pretrained embeddings with the floor's
encoder (``enc_random``), and the pretrained model with the floor's last layer
(``last_layer_random``). All five go through one paired sweep on BC5CDR chemical and disease
(lr 1e-3, 10 epochs, 500 training sentences, seeds 1 and 2), in ``<run-dir>/diagnosis``.
Last line: JSON of each model's mean test F1 x 100 per task.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "ner"
HYBRIDS = {"emb_random": lambda k: ".embeddings." in k,
           "enc_random": lambda k: ".encoder." in k or ".pooler." in k,
           "last_layer_random": lambda k: ".encoder.layer.1." in k}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--arm", default="conventional")
    p.add_argument("--floor", default="random_init")
    args = p.parse_args()
    arms = json.loads((args.run_dir / "experiment.json").read_text())["arms"]
    pretrained, floor = Path(arms[args.arm]["model_dir"]), Path(arms[args.floor]["model_dir"])
    out = args.run_dir / "diagnosis"
    weights, untrained = load_file(pretrained / "model.safetensors"), load_file(floor / "model.safetensors")
    models = {"pretrained": str(pretrained), "random": str(floor)}
    for name, from_floor in HYBRIDS.items():
        d = out / "models" / name
        shutil.copytree(pretrained, d, dirs_exist_ok=True)
        mixed = {k: (untrained[k] if from_floor(k) else v).clone() for k, v in weights.items()}
        save_file(mixed, str(d / "model.safetensors"), metadata={"format": "pt"})
        models[name] = str(d)
    tasks = {"bc5cdr_chem_iob": "BC5CDR-chem-IOB", "bc5cdr_disease_iob": "BC5CDR-disease-IOB"}
    config = {"run_name": "sweep", "runs_root": str(out), "stages": ["sweep", "report"], "compare_models": models,
              "sweep": {"search_space": "tiny", "learning_rates": [1.0e-3], "seeds": [1, 2],
                        "max_train_examples": 500, "max_eval_examples": 300,
                        "tasks": list(tasks), "epochs": {t: [10] for t in tasks},
                        "task_dirs": {t: str(DATA / d) for t, d in tasks.items()}}}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), "--config", str(out / "config.yaml")],
                   cwd=ROOT, check=True)
    results = json.loads((out / "sweep" / "sweep" / "results.json").read_text())
    print((out / "sweep" / "report" / "blue_table.md").read_text().split("\n\n")[1])
    print(json.dumps({m: {t: round(100 * c["mean"], 1) for t, c in cells.items()}
                      for m, cells in results["cells"].items()}))


if __name__ == "__main__":
    main()
