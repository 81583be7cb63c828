"""``jobs/tokenizer_quality.py``: continued-word rate and fertility of tokenizers per language (seed 002, Figure 3).

    run(TokenizerQualityConfig(tokenizers={"minilm": dir}, texts={"de": "de.txt", "de:specific": "ner.iob"}))

The measures, the words they count and the table are ``orchestrator.vocab.quality``'s (the vocabulary
stage measures its own tokenizer with them too); this module is the standalone job: its config, its
dry run, and its run, which prints the table and writes it when ``out_dir`` is set (as a whole, with a
manifest: a folder the project did not write, or another stage's output, is refused before any work).
"""
from __future__ import annotations

import dataclasses
import json

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    check_replaceable,
    write_manifest,
)
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.vocab.quality import (
    check_quality_settings,
    load_tokenizers,
    quality_inputs,
    quality_table,
    read_text_sets,
    render_markdown,
)

STAGE = "tokenizer_quality"


@dataclasses.dataclass(frozen=True)
class TokenizerQualityConfig:
    tokenizers: dict[str, str] = field(default_factory=dict, help="name -> Hugging Face tokenizer or model "
                                                                  "directory (--tokenizer NAME=DIR)")
    texts: dict[str, str] = field(default_factory=dict, help="'<language>' or '<language>:<kind>' -> text file "
                                                             "(--text de:specific=FILE): plain text a unit per line, "
                                                             "JSONL, SQuAD .json (its paragraphs: XQuAD), or a task "
                                                             "file (BLUE TSV, IOB, BLUE NER)")
    max_lines: int = field(5000, help="text units read from each file")
    out_dir: str = field("", help="write tokenizer_quality.json and .md here (with a manifest.json; a folder "
                                  "this job did not write is refused); empty = print only")

    def __post_init__(self) -> None:
        if not self.tokenizers or not self.texts:
            raise ConfigError("give at least one tokenizer (--tokenizer NAME=DIR) and one text (--text LANG=FILE)")
        check_quality_settings(self.tokenizers, self.texts, self.max_lines, keys="")  # the vocab stage's checks


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: TokenizerQualityConfig) -> list[dict]:
    """Measure every tokenizer on every text; print the Markdown table, then as its last line JSON such as
    ``{"tokenizer_quality": {"de:text": {"minilm": {"continued_words": 0.41, "fertility": 1.9}}}}``."""
    if cfg.out_dir:
        check_replaceable(cfg.out_dir, STAGE)  # a folder the project did not write: refused before any work
    texts = read_text_sets(cfg.texts, cfg.max_lines)
    rows = quality_table(load_tokenizers(cfg.tokenizers), texts)
    table = render_markdown(rows)
    if cfg.out_dir:
        with atomic_dir(cfg.out_dir, STAGE) as tmp:
            atomic_write_json(tmp / "tokenizer_quality.json", rows)
            atomic_write_text(tmp / "tokenizer_quality.md", table)
            write_manifest(tmp, stage=STAGE, config=cfg, inputs=quality_inputs(cfg),
                           counts={"tokenizers": len(cfg.tokenizers), "text_sets": len(texts)})
    print(table)
    summary: dict[str, dict] = {}
    for r in rows:
        summary.setdefault(f"{r['language']}:{r['kind']}", {})[r["tokenizer"]] = {
            "continued_words": r["continued_words"], "fertility": r["fertility"]}
    print(json.dumps({"tokenizer_quality": summary}))
    return rows


def plan(cfg: TokenizerQualityConfig) -> str:
    """Dry run: every tokenizer loads, every text file reads, the run may write ``out_dir``; nothing is
    measured or written."""
    if cfg.out_dir:
        check_replaceable(cfg.out_dir, STAGE)
    names = list(load_tokenizers(cfg.tokenizers))
    texts = read_text_sets(cfg.texts, cfg.max_lines)
    return (f"tokenizer quality: {', '.join(names)} on "
            + ", ".join(f"{t.language}:{t.kind} ({len(t.lines)} units)" for t in texts)
            + (f"; write {cfg.out_dir}/tokenizer_quality.json, .md" if cfg.out_dir else "; print only"))
