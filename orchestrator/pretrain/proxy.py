"""Proxy models for a RegMix-style mixture search: shared token pools, one small MLM run per mixture.

    info = build_pools(sources, targets, PoolConfig(), out_dir)           # once: read, split, vocab, tokenize
    record = train_proxy(out_dir, {"pubmed": 0.6, "wiki": 0.4}, ProxyModelConfig(), seed=0)
    record["target_mlm_loss"]                                             # on the same masked target positions

A proxy costs only its training. ``build_pools`` reads every candidate source once (the corpus
stage's readers and sentence splitting), trains one WordPiece vocabulary on the uniform mixture
of the sources (each source's first ``vocab_chars`` characters, the same share of every source,
so the vocabulary favours none), tokenizes each source once and packs its sentences, in document
order, into full sequences ``[CLS] ... [SEP]`` of ``max_seq_length`` tokens (``pool_<name>.npy``).
The target text (task files of any format ``orchestrator.formats.text_units`` reads) is tokenized
with the same vocabulary, packed the same way and masked once with a fixed seed by BERT's rule
(``orchestrator.instances.masking.mask_batch``): every proxy is scored on the same positions.

``train_proxy`` draws its mixture's sequences from the pools (each source's share of the
``train_tokens`` budget, without replacement while a pool lasts), trains a fresh masked-LM BERT
(the same initial weights for every proxy, ``init_seed``) with dynamic masking, AdamW and a linear
warm-up / decay, and returns the mean masked-LM cross-entropy on the target positions. Pure
functions of files on disk, so a Ray Tune trial (``orchestrator.workflows.proxy_search``) or a test runs them alike.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from orchestrator.core.config import field, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import library_versions, write_manifest
from orchestrator.corpus.sources import SourceConfig, document_rows, source_files
from orchestrator.formats import text_units
from orchestrator.instances.config import MaskingRule, Specials
from orchestrator.instances.masking import mask_batch
from orchestrator.pretrain.data import IGNORE_INDEX
from orchestrator.vocab.wordpiece import VocabConfig

log = logging.getLogger("proxy")

POOLS_STAGE = "proxy_pools"
TOKENIZER_DIR = "tokenizer"
TARGET_IDS, TARGET_LABELS = "target_input_ids.npy", "target_labels.npy"
SIZES = ("tiny", "bert-tiny", "mini", "small")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    vocab_size: int = field(8000, help="WordPiece vocabulary of every proxy, trained once on the uniform mixture")
    vocab_chars: int = field(0, help="characters of each source the vocabulary is trained on (the same for "
                                     "every source: the uniform mixture); 0 = the smallest source's size")
    max_seq_length: int = field(64, help="tokens per packed sequence, [CLS] and [SEP] included (training and target)")
    max_target_sequences: int = field(512, help="target sequences the loss is measured on (evenly spaced over the "
                                                "packed target text when there are more)")
    masked_lm_prob: float = field(0.15, help="share of tokens masked (BERT's 80/10/10), in training and target")
    seed: int = field(0, help="seed of the target's masked positions and of the spacing of its sequences")

    def __post_init__(self) -> None:
        if self.max_seq_length < 8:
            raise ConfigError(f"pools.max_seq_length must be >= 8, got {self.max_seq_length}")
        if self.max_target_sequences < 1 or self.vocab_chars < 0:
            raise ConfigError("pools.max_target_sequences must be >= 1 and pools.vocab_chars >= 0")
        if not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"pools.masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        VocabConfig(vocab_size=self.vocab_size)  # the vocabulary's own checks


@dataclasses.dataclass(frozen=True)
class ProxyModelConfig:
    size: str = field("tiny", help="proxy architecture: tiny (hidden 64, 2 layers) | bert-tiny | mini | small "
                                   "(orchestrator.pretrain.config.SIZE_PRESETS)")
    train_tokens: int = field(200_000, help="the fixed budget: tokens each proxy trains on (steps = budget / "
                                            "(batch_size x max_seq_length), rounded up)")
    batch_size: int = field(32, help="sequences per optimizer step")
    learning_rate: float = field(2e-3, help="peak AdamW learning rate")
    warmup_proportion: float = field(0.1, help="share of the steps in linear warm-up, then linear decay to 0")
    weight_decay: float = field(0.01, help="AdamW weight decay (not on biases and LayerNorm)")
    init_seed: int = field(0, help="seed of the initial weights: the same for every proxy")
    threads: int = field(1, help="torch threads per proxy (one trial per CPU on a small machine)")

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ConfigError(f"proxy.size {self.size!r}: one of {list(SIZES)}")
        if self.train_tokens < 1 or self.batch_size < 1 or self.threads < 1:
            raise ConfigError("proxy.train_tokens, proxy.batch_size and proxy.threads must be >= 1")
        if not self.learning_rate > 0 or not 0 <= self.warmup_proportion < 1:
            raise ConfigError("proxy.learning_rate must be > 0 and proxy.warmup_proportion in [0, 1)")

    def steps(self, max_seq_length: int) -> int:
        return max(1, math.ceil(self.train_tokens / (self.batch_size * max_seq_length)))


# --------------------------------------------------------------------------------------------- pools
def source_sentences(src: SourceConfig) -> Iterable[list[str]]:
    """Each document of ``src`` as its sentences, read and split as the corpus stage does."""
    for index, path in enumerate(source_files(src)):
        for batch in document_rows(src, path, index):
            yield from batch["sentences"]


def pack(ids: np.ndarray, specials: Specials, length: int) -> np.ndarray:
    """A flat token stream cut into full sequences [CLS] + (length - 2) tokens + [SEP] (the tail dropped)."""
    body = length - 2
    n = len(ids) // body
    out = np.empty((n, length), dtype=np.int32)
    out[:, 0], out[:, -1] = specials.cls, specials.sep
    out[:, 1:-1] = np.asarray(ids[:n * body], np.int32).reshape(n, body)
    return out


def _chars_prefix(docs: Sequence[list[str]], chars: int) -> Iterable[str]:
    seen = 0
    for sentences in docs:
        for s in sentences:
            if seen >= chars:
                return
            seen += len(s)
            yield s


def build_pools(sources: Sequence[SourceConfig], targets: Mapping[str, Sequence[str]], cfg: PoolConfig,
                out_dir: Path, progress: Callable[[str], None] = log.info) -> dict:
    """Read, split and tokenize every source once; the packed pools, the vocabulary and the masked target
    sequences into ``out_dir`` with a manifest. Returns the manifest's counts."""
    from tokenizers import Tokenizer  # heavy: tokenizers

    from orchestrator.instances.encoding import SentenceEncoder  # heavy: pyarrow behind it
    from orchestrator.vocab.wordpiece import save_tokenizer, train_wordpiece

    started = time.perf_counter()
    docs: dict[str, list[list[str]]] = {}
    for src in sources:
        docs[src.name] = [s for s in source_sentences(src) if s]
        progress(f"pools: read {src.name}: {len(docs[src.name])} documents, "
                 f"{sum(len(x) for d in docs[src.name] for x in d):,} characters")
    sizes = {name: sum(len(x) for d in d_ for x in d) for name, d_ in docs.items()}
    chars = cfg.vocab_chars or min(sizes.values())
    vocab_cfg = VocabConfig(vocab_size=cfg.vocab_size, ampv=False, report=False)
    union = (s for name in docs for s in _chars_prefix(docs[name], chars))
    tokenizer = train_wordpiece(union, vocab_cfg)
    save_tokenizer(tokenizer, out_dir / TOKENIZER_DIR)
    tokenizer = Tokenizer.from_file(str(out_dir / TOKENIZER_DIR / "tokenizer.json"))
    specials = Specials.from_vocab(tokenizer.get_vocab())
    progress(f"pools: vocabulary of {specials.vocab_size} pieces trained on {chars:,} characters of each source")
    encoder = SentenceEncoder(tokenizer)
    counts: dict = {"sources": {}, "vocab_chars_per_source": chars}
    for name, d in docs.items():
        ids, _ = encoder.encode_flat([s for sentences in d for s in sentences])
        rows = pack(ids, specials, cfg.max_seq_length)
        if len(rows) == 0:
            raise InputError(next(s for s in sources if s.name == name).paths[0],
                             f"source {name!r} has fewer than {cfg.max_seq_length - 2} tokens",
                             expected="enough text for one packed sequence")
        np.save(out_dir / f"pool_{name}.npy", rows)
        counts["sources"][name] = {"characters": sizes[name], "tokens": int(len(ids)), "sequences": int(len(rows))}
        progress(f"pools: {name}: {len(ids):,} tokens -> {len(rows):,} sequences of {cfg.max_seq_length}")
    units = [u for paths in targets.values() for p in paths for u in text_units(p)]
    if not units:
        raise InputError(next(p for ps in targets.values() for p in ps), "target files hold no text",
                         expected="task files with text (TSV, IOB, plain text)")
    ids, _ = encoder.encode_flat(units)
    rows = pack(ids, specials, cfg.max_seq_length)
    if len(rows) == 0:
        raise InputError(next(p for ps in targets.values() for p in ps),
                         f"target text has fewer than {cfg.max_seq_length - 2} tokens", expected="more target text")
    gen = np.random.default_rng(cfg.seed)
    if len(rows) > cfg.max_target_sequences:
        rows = rows[np.linspace(0, len(rows) - 1, cfg.max_target_sequences).round().astype(np.int64)]
    input_ids = rows.astype(np.int64)
    lengths = np.full(len(rows), cfg.max_seq_length, np.int64)
    rule = MaskingRule(cfg.masked_lm_prob, max_predictions_per_seq=cfg.max_seq_length, whole_word_mask=False)
    chosen, originals = mask_batch(input_ids, lengths, rule, specials, specials.continuation_mask(), gen)
    labels = np.full_like(input_ids, IGNORE_INDEX)
    labels[chosen] = originals
    np.save(out_dir / TARGET_IDS, input_ids.astype(np.int32))
    np.save(out_dir / TARGET_LABELS, labels.astype(np.int32))
    counts["target"] = {"units": len(units), "tokens": int(len(ids)), "sequences": int(len(rows)),
                        "masked": int(chosen.sum())}
    progress(f"pools: target: {len(units):,} units, {len(ids):,} tokens -> {len(rows)} sequences, "
             f"{int(chosen.sum()):,} masked positions (fixed)")
    write_manifest(out_dir, stage=POOLS_STAGE, config={"pools": to_dict(cfg), "sources": [to_dict(s) for s in sources],
                                                       "targets": {k: list(v) for k, v in targets.items()}},
                   inputs=[*(p for s in sources for p in source_files(s)), *(p for ps in targets.values() for p in ps)],
                   counts=counts, seed=cfg.seed, extra={"seconds": round(time.perf_counter() - started, 2),
                                                         "specials": specials.to_dict()})
    return counts


def pool_info(pools_dir: Path) -> tuple[Specials, float]:
    """The pools' special ids and their masking probability (from their manifest)."""
    manifest = json.loads((Path(pools_dir) / "manifest.json").read_text(encoding="utf-8"))
    return Specials.from_dict(manifest["specials"]), float(manifest["config"]["pools"]["masked_lm_prob"])


# --------------------------------------------------------------------------------------------- one proxy
def share_out(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """``total`` sequences shared out by ``weights`` (largest remainder: the counts sum to ``total``)."""
    norm = sum(weights.values())
    exact = {k: total * w / norm for k, w in weights.items()}
    counts = {k: int(math.floor(v)) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (counts[k] - exact[k], k))[:total - sum(counts.values())]:
        counts[k] += 1
    return counts


def draw_rows(pools: Mapping[str, np.ndarray], weights: Mapping[str, float], total: int,
              rng: np.random.Generator) -> tuple[np.ndarray, dict[str, int]]:
    """The mixture's training sequences, shuffled: each source's share drawn from its pool, without
    replacement while the pool lasts (whole passes over it, then a sample of the rest)."""
    counts = share_out(weights, total)
    parts = []
    for name, n in counts.items():
        pool = pools[name]
        full, rest = divmod(n, len(pool))
        idx = [rng.permutation(len(pool)) for _ in range(full)] + [rng.choice(len(pool), rest, replace=False)]
        parts.append(pool[np.concatenate(idx)])
    rows = np.concatenate(parts)
    return rows[rng.permutation(len(rows))], counts


def train_proxy(pools_dir: Path, weights: Mapping[str, float], cfg: ProxyModelConfig, seed: int,
                report: Callable[[dict], None] | None = None) -> dict:
    """Train one proxy on the mixture ``weights`` and measure its masked-LM loss on the target positions."""
    import torch  # heavy: torch

    from orchestrator.pretrain.config import ModelConfig  # heavy: torch, transformers behind the model
    from orchestrator.pretrain.model import PretrainingModule, build_model
    from orchestrator.pretrain.optim import build_scheduler, parameter_groups

    started = time.perf_counter()
    pools_dir = Path(pools_dir)
    torch.set_num_threads(cfg.threads)
    specials, masked_lm_prob = pool_info(pools_dir)
    pools = {name: np.load(pools_dir / f"pool_{name}.npy", mmap_mode="r") for name, w in weights.items() if w > 0}
    length = next(iter(pools.values())).shape[1]
    steps = cfg.steps(length)
    rng = np.random.default_rng(seed)
    rows, counts = draw_rows(pools, {k: w for k, w in weights.items() if w > 0}, steps * cfg.batch_size, rng)
    torch.manual_seed(cfg.init_seed)
    model = build_model(ModelConfig(size=cfg.size, objective="mlm", max_position_embeddings=max(length, 64),
                                    dropout=0.1), specials.vocab_size, specials.pad)
    module = PretrainingModule(model)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.learning_rate)
    scheduler = build_scheduler(optimizer, max(1, round(steps * cfg.warmup_proportion)), steps, 1.0)
    rule = MaskingRule(masked_lm_prob, max_predictions_per_seq=length, whole_word_mask=False)
    continuation = specials.continuation_mask()
    lengths = np.full(cfg.batch_size, length, np.int64)
    torch.manual_seed(cfg.init_seed + 1)  # dropout: the same stream for every proxy
    module.train()
    losses: list[float] = []
    for step in range(steps):
        ids = rows[step * cfg.batch_size:(step + 1) * cfg.batch_size].astype(np.int64)
        chosen, originals = mask_batch(ids, lengths, rule, specials, continuation, rng)
        labels = np.full_like(ids, IGNORE_INDEX)
        labels[chosen] = originals
        out = module(input_ids=torch.from_numpy(ids), token_type_ids=torch.zeros_like(torch.from_numpy(ids)),
                     attention_mask=torch.ones(ids.shape, dtype=torch.long), labels=torch.from_numpy(labels))
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(out["mlm_loss"].item())
        if report and (step + 1) % max(1, steps // 4) == 0 and step + 1 < steps:
            report({"step": step + 1, "train_loss": float(np.mean(losses[-20:]))})
    target_loss, accuracy = evaluate_target(module, pools_dir)
    return {"weights": dict(weights), "sequences": counts, "steps": steps,
            "train_tokens": steps * cfg.batch_size * length,
            "train_loss": float(np.mean(losses[-max(1, steps // 10):])), "target_mlm_loss": target_loss,
            "target_mlm_accuracy": accuracy, "seconds": round(time.perf_counter() - started, 2),
            "versions": library_versions()}  # what it trained under: a search reusing it says an upgrade since


def evaluate_target(module, pools_dir: Path, batch: int = 64) -> tuple[float, float]:
    """Mean masked-LM cross-entropy (nats per masked token) and accuracy on the fixed target positions."""
    import torch  # heavy: torch

    ids = np.load(Path(pools_dir) / TARGET_IDS).astype(np.int64)
    labels = np.load(Path(pools_dir) / TARGET_LABELS).astype(np.int64)
    total, correct, count = 0.0, 0, 0
    module.eval()
    with torch.no_grad():
        for start in range(0, len(ids), batch):
            x = torch.from_numpy(ids[start:start + batch])
            y = torch.from_numpy(labels[start:start + batch])
            out = module(input_ids=x, token_type_ids=torch.zeros_like(x), attention_mask=torch.ones_like(x), labels=y)
            n = int(out["mlm_count"])
            total += float(out["mlm_loss"]) * n
            correct += int(out["mlm_correct"])
            count += n
    module.train()
    return total / max(count, 1), correct / max(count, 1)


__all__ = ["PoolConfig", "ProxyModelConfig", "build_pools", "train_proxy", "evaluate_target", "pack", "share_out",
           "draw_rows", "pool_info", "POOLS_STAGE"]
