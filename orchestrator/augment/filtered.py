"""The filtered-BERT augmenter, without Ray.

Plan (pure): which sentence each augmented copy comes from and which k words it replaces,
seeded per (seed, sentence, copy) so the output does not depend on batching or worker count.
Predict (torch): mask the chosen words, take the MLM's best whole-word proposals.
Filter (pure): accept the first proposal whose fastText cosine to the original lies in
(min_similarity, max_similarity]; otherwise the word stays as it was.

``FilteredAugmenter.augment`` batches many masked inputs per forward pass (what the Ray actors
run); ``augment_loop`` is the straightforward per-sentence, per-word reference with one forward
pass per word, kept as the benchmark baseline and the tests' oracle.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.augment.config import AugmentConfig
from orchestrator.core.artifacts import check_model
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_json_object

log = logging.getLogger(__name__)

_LETTER = re.compile(r"[^\W\d_]")
Similarity = Callable[[str, str], "float | None"]


# ------------------------------------------------------------------------------------------ plan
def eligible_positions(tokens: Sequence[str], tags: Sequence[str], replace_entities: bool,
                       min_word_length: int) -> list[int]:
    """Word positions that may be replaced: long enough, holding a letter, outside entities
    unless ``replace_entities``."""
    return [i for i, (tok, tag) in enumerate(zip(tokens, tags))
            if len(tok) >= min_word_length and _LETTER.search(tok) and (replace_entities or tag == "O")]


def choose_positions(tokens: Sequence[str], tags: Sequence[str], cfg: AugmentConfig, source: int,
                     copy: int) -> list[int]:
    """The k positions this copy replaces, in sentence order; a fixed function of
    (seed, source sentence, copy) so parallel and serial runs agree."""
    pool = eligible_positions(tokens, tags, cfg.replace_entities, cfg.min_word_length)
    rng = random.Random(f"{cfg.seed}:{source}:{copy}")
    return sorted(rng.sample(pool, min(cfg.words_per_sentence, len(pool))))


def plan_rows(sentences: Sequence[tuple[Sequence[str], Sequence[str]]], cfg: AugmentConfig) -> list[dict]:
    """One row per augmented sentence: round(len(sentences) x multiple) rows, cycling through the
    sentences (copy c of sentence i is row c * n + i). Method ``repeat`` replaces no word, so its
    rows have no positions."""
    n = len(sentences)
    total = int(round(n * cfg.multiple))
    rows = []
    for uid in range(total):
        source, copy = uid % n, uid // n
        tokens, tags = sentences[source]
        rows.append({"uid": uid, "source": source, "copy": copy, "tokens": list(tokens), "tags": list(tags),
                     "positions": [] if cfg.method == "repeat" else choose_positions(tokens, tags, cfg, source,
                                                                                       copy)})
    return rows


def repeat_rows(rows: Sequence[dict]) -> list[dict]:
    """Method ``repeat`` (the equal-steps control): each planned row's sentence as it is, in the
    record format of ``apply_decisions`` (nothing replaced, rejected or kept)."""
    return [{"uid": r["uid"], "source": r["source"], "copy": r["copy"], "tokens": list(r["tokens"]),
             "tags": list(r["tags"]), "replaced": [], "rejected": [], "kept": []} for r in rows]


# ---------------------------------------------------------------------------------------- filter
def usable_piece(piece: str, special: frozenset[str]) -> bool:
    """A vocabulary entry that can stand as a whole word: not special, not a ## continuation,
    holding a letter."""
    return piece not in special and not piece.startswith("##") and not piece.startswith("[unused") \
        and bool(_LETTER.search(piece))


def match_case(candidate: str, original: str) -> str:
    """An uncased MLM proposes lowercase: give the proposal the original word's capitalisation."""
    if original.isupper() and len(original) > 1:
        return candidate.upper()
    if original[:1].isupper():
        return candidate[:1].upper() + candidate[1:]
    return candidate


@dataclasses.dataclass(frozen=True)
class Decision:
    """The filter's verdict on one masked word."""

    replacement: str | None  # None: every proposal was rejected (the word stays)
    similarity: float | None
    rank: int | None  # 1-based rank of the accepted proposal among usable proposals
    rejected: tuple[tuple[str, float | None], ...]


def filter_candidates(original: str, proposals: Sequence[str], similarity: Similarity, low: float,
                      high: float) -> Decision:
    """Accept the first proposal (best first) with low < cosine <= high; the original word itself
    and proposals without a vector are rejected."""
    rejected: list[tuple[str, float | None]] = []
    for rank, word in enumerate(proposals, 1):
        if word.lower() == original.lower():
            rejected.append((word, 1.0))
            continue
        sim = similarity(original, word)
        if sim is not None and low < sim <= high:
            return Decision(match_case(word, original), sim, rank, tuple(rejected))
        rejected.append((word, sim))
    return Decision(None, None, None, tuple(rejected))


def apply_decisions(row: dict, decisions: dict[int, Decision]) -> dict:
    """The augmented sentence (tags carried over unchanged) and its record for the manifest."""
    tokens = list(row["tokens"])
    replaced, rejected, kept = [], [], []
    for pos in row["positions"]:
        d = decisions.get(pos)
        original = row["tokens"][pos]
        if d is None:  # outside the MLM window of a very long sentence
            kept.append(pos)
            continue
        rejected.extend({"position": pos, "original": original, "candidate": w,
                         "similarity": None if s is None else round(s, 4)} for w, s in d.rejected)
        if d.replacement is None:
            kept.append(pos)
            continue
        tokens[pos] = d.replacement
        replaced.append({"position": pos, "original": original, "replacement": d.replacement,
                         "similarity": round(d.similarity, 4), "rank": d.rank})
    return {"uid": row["uid"], "source": row["source"], "copy": row["copy"], "tokens": tokens,
            "tags": list(row["tags"]), "replaced": replaced, "rejected": rejected, "kept": kept}


# --------------------------------------------------------------------------------------- predict
MLM_EXPECTED = ("a BertForMaskedLM or BertForPreTraining checkpoint; an encoder-only model needs a head first "
                "(orchestrator.augment.mlm_head)")
#: Architectures (config.json) whose checkpoints hold BERT's masked-LM head, ``cls.predictions``.
MLM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")
#: Largest safetensors header believed (a BERT's is tens of KB; a bigger one is not a header).
MAX_HEADER_BYTES = 100 << 20


def check_mlm_dir(model_dir: str | Path, name: str = "model_dir") -> Path:
    """What ``MaskedWordPredictor`` will load, checked without torch (the dry run's check, and the
    run's before Ray): a BERT directory as every job checks one (``check_model``: config, weights,
    tokenizer), whose weights hold the masked-LM head (tensor names from the safetensors header or a
    shard index; for a lone pytorch_model.bin, config.json's ``architectures``). ``name``: the
    setting that named it. Returns the directory."""
    path = Path(model_dir)
    info = check_model(name, path)
    if info["model_type"] != "bert":
        raise InputError(path / "config.json", f"model_type is {info['model_type']!r}",
                         expected="a BERT masked language model")
    names = weight_names(path)
    if names is None:  # a pickled pytorch_model.bin: its names need torch to read
        architectures = info["architectures"]
        if architectures and not set(architectures) & set(MLM_ARCHITECTURES):
            raise InputError(path / "config.json", f"no masked-LM head (architectures {architectures})",
                             expected=MLM_EXPECTED)
    elif not any(n.startswith("cls.predictions.") and not n.endswith("decoder.weight") for n in names):
        raise InputError(path, "no masked-LM head (no cls.predictions.* weights; architectures "
                               f"{info['architectures']})", expected=MLM_EXPECTED)
    elif DECODER not in names and not tied_decoder(read_json_object(path / "config.json", "a model config")):
        raise InputError(path / "config.json", f"tie_word_embeddings is false but the weights hold no {DECODER} "
                                               "(transformers would draw it at random)",
                         expected=f"{DECODER} in the weights, or tie_word_embeddings true")
    return path


#: The masked-LM head's output weights: the word embeddings themselves unless the config unties them.
DECODER = "cls.predictions.decoder.weight"


def tied_decoder(config: dict) -> bool:
    """Whether a BERT config ties the masked-LM decoder to the word embeddings (transformers' default)."""
    return config.get("tie_word_embeddings", True) is not False


def weight_names(model_dir: Path) -> list[str] | None:
    """The tensor names of a Hugging Face model directory's weights: from ``model.safetensors``'s
    header (8 bytes of little-endian length, then JSON) or a sharded checkpoint's index; None for a
    lone ``pytorch_model.bin``. Raises InputError when there are no weights or the header is not one."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (model_dir / index).is_file():
            weight_map = read_json_object(model_dir / index, "a Hugging Face shard index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise InputError(model_dir / index, "no weight_map", expected="a Hugging Face shard index")
            return list(weight_map)
    file = model_dir / "model.safetensors"
    if not file.is_file():
        if (model_dir / "pytorch_model.bin").is_file():
            return None
        raise InputError(model_dir, "no weights (model.safetensors or pytorch_model.bin)", expected=MLM_EXPECTED)
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = f.read(size) if 2 <= size <= min(MAX_HEADER_BYTES, file.stat().st_size - 8) else b""
    try:
        names = json.loads(header)
    except ValueError:  # also a header that is not UTF-8
        names = None
    if not isinstance(names, dict):
        raise InputError(file, "not a safetensors file (no JSON header after its first 8 bytes)",
                         expected="weights saved by save_pretrained")
    return [n for n in names if n != "__metadata__"]


class MaskedWordPredictor:
    """An MLM that proposes whole words for masked word positions, batched."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", max_seq_length: int = 128,
                 batch_size: int = 64):
        import torch  # heavy: torch, transformers
        from transformers import AutoTokenizer, BertForMaskedLM

        from orchestrator.modeling.encoder import from_pretrained  # heavy: transformers

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise InputError(model_dir, "not a Hugging Face model directory", expected="config.json and a "
                                                                                      "tokenizer")
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        model, info = from_pretrained(BertForMaskedLM, model_dir, output_loading_info=True)
        missing = [k for k in info.get("missing_keys", ()) if k.startswith("cls.predictions")
                   and not (k == DECODER and tied_decoder(model.config.to_dict()))]  # tied: the embeddings
        if missing:
            raise InputError(model_dir, f"no masked-LM head (missing {missing[:3]})", expected=MLM_EXPECTED)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.max_len = max_seq_length
        self.batch_size = batch_size
        self.mask_id = self.tokenizer.mask_token_id
        self.cls_id = self.tokenizer.cls_token_id
        self.sep_id = self.tokenizer.sep_token_id
        vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        special = frozenset(self.tokenizer.all_special_tokens)
        self.vocab = vocab
        usable = torch.tensor([usable_piece(p, special) for p in vocab], device=self.device)
        self.usable_ids = usable.nonzero().squeeze(1)
        decoder = self.model.cls.predictions.decoder  # logits for whole-word pieces only
        self.usable_weight = decoder.weight.detach()[self.usable_ids]
        self.usable_bias = decoder.bias.detach()[self.usable_ids]

    def word_pieces(self, tokens: Sequence[str]) -> list[list[int]]:
        """Word-piece ids of each word (no special tokens)."""
        enc = self.tokenizer(list(tokens), is_split_into_words=True, add_special_tokens=False)
        pieces: list[list[int]] = [[] for _ in tokens]
        for piece_id, w in zip(enc["input_ids"], enc.word_ids()):
            if w is not None:
                pieces[w].append(piece_id)
        return pieces

    def masked_input(self, pieces: list[list[int]], masked: Sequence[int]) -> tuple[list[int], dict[int, int]]:
        """[CLS] words [SEP] with each masked word as one [MASK]; windowed around the first mask
        when too long. Returns ids and {word position: index of its [MASK]} (inside the window)."""
        ids: list[int] = []
        where: dict[int, int] = {}
        masked_set = set(masked)
        for w, word_ids in enumerate(pieces):
            if w in masked_set:
                where[w] = len(ids)
                ids.append(self.mask_id)
            else:
                ids.extend(word_ids or [self.tokenizer.unk_token_id])
        room = self.max_len - 2
        start = 0
        if len(ids) > room:
            first = min(where.values()) if where else 0
            start = max(0, min(first - room // 2, len(ids) - room))
            ids = ids[start:start + room]
        where = {w: i - start + 1 for w, i in where.items() if 0 <= i - start < room}
        return [self.cls_id] + ids + [self.sep_id], where

    def masked_states(self, ids, rows, cols):
        """Final hidden states at the [MASK] positions ``(rows[j], cols[j])`` of a batch without
        padding. Every layer but the last runs on all positions; the last one, whose output is
        read only at the masks, runs its query, attention output and feed-forward there alone
        (keys and values still cover every position). The states of ``model.bert`` to float
        rounding, at ~1/7 less work (tests/test_augment.py compares them)."""
        import torch  # heavy: torch

        bert = self.model.bert
        hidden = bert.embeddings(input_ids=ids)
        for layer in bert.encoder.layer[:-1]:
            hidden = layer(hidden)
        last = bert.encoder.layer[-1]
        att = last.attention.self

        def heads(x):  # [..., length, hidden] -> [..., heads, length, head size]
            return x.view(*x.shape[:-1], att.num_attention_heads, att.attention_head_size).transpose(-3, -2)

        at_mask = hidden[rows, cols]
        context = torch.nn.functional.scaled_dot_product_attention(
            heads(att.query(at_mask).unsqueeze(1)), heads(att.key(hidden))[rows], heads(att.value(hidden))[rows],
            scale=att.scaling)
        attended = last.attention.output(context.transpose(1, 2).reshape(at_mask.shape), at_mask)
        return last.output(last.intermediate(attended), attended)

    def propose(self, inputs: list[tuple[list[int], dict[int, int]]], top_n: int) -> list[dict[int, list[str]]]:
        """For each input, {word position: up to top_n usable proposals, best first}.

        Inputs of equal length share a forward pass (up to ``batch_size`` of them), so nothing is
        padded: the k masked copies of a sentence always match, and on BC5CDR padding to the
        longest input of a batch had doubled the tokens computed. The MLM head runs only at the
        [MASK] positions (see ``masked_states``), only over the usable vocabulary, and on all the
        masks of the call together: its weights (22,644 usable pieces x 384 for MiniLM, 35 MB) are
        read once per 256 masks, not once per forward pass."""
        import torch  # heavy: torch

        order: list[int] = []  # input index of each masked state, in the order computed
        states = []
        with torch.inference_mode():
            for chunk in same_length_batches(inputs, self.batch_size):
                ids = torch.tensor([inputs[i][0] for i in chunk], device=self.device)
                rows = torch.tensor([r for r, i in enumerate(chunk) for _ in inputs[i][1]], device=self.device)
                cols = torch.tensor([c for i in chunk for c in inputs[i][1].values()], device=self.device)
                states.append(self.masked_states(ids, rows, cols))
                order.extend(i for i in chunk for _ in inputs[i][1])
            best: list[list[int]] = []
            transform, top_n = self.model.cls.predictions.transform, min(top_n, len(self.usable_ids))
            for block in torch.cat(states).split(256) if states else ():
                logits = torch.nn.functional.linear(transform(block), self.usable_weight, self.usable_bias)
                best.extend(self.usable_ids[logits.float().topk(top_n, dim=-1).indices].tolist())
        out: list[dict[int, list[str]]] = [{} for _ in inputs]
        positions = {i: iter(inputs[i][1]) for i in set(order)}
        for i, ranked in zip(order, best):
            out[i][next(positions[i])] = [self.vocab[p] for p in ranked]
        return out


def same_length_batches(inputs: Sequence[tuple[list[int], dict]], batch_size: int) -> list[list[int]]:
    """Indices of ``inputs`` grouped by length, at most ``batch_size`` a group, shortest first;
    inputs without a mask inside their window are left out (nothing to predict)."""
    by_length: dict[int, list[int]] = {}
    for i, (ids, where) in enumerate(inputs):
        if where:
            by_length.setdefault(len(ids), []).append(i)
    return [group[s:s + batch_size] for _, group in sorted(by_length.items())
            for s in range(0, len(group), batch_size)]


# --------------------------------------------------------------------------------------- augment
class FilteredAugmenter:
    """MLM proposals + similarity filter over planned rows (see ``plan_rows``)."""

    def __init__(self, cfg: AugmentConfig, predictor: MaskedWordPredictor, similarity: Similarity):
        self.cfg = cfg
        self.predictor = predictor
        self.similarity = similarity

    def _decide(self, row: dict, proposals: dict[int, list[str]]) -> dict[int, Decision]:
        return {pos: filter_candidates(row["tokens"][pos], props, self.similarity, self.cfg.min_similarity,
                                       self.cfg.max_similarity)
                for pos, props in proposals.items()}

    def _masks(self, row: dict) -> list[list[int]]:
        if not row["positions"]:
            return []
        if self.cfg.mask_mode == "joint":
            return [list(row["positions"])]
        return [[pos] for pos in row["positions"]]

    def augment(self, rows: list[dict]) -> list[dict]:
        """Every masked input of every row in shared forward passes of ``batch_size``."""
        inputs, owner = [], []
        for r, row in enumerate(rows):
            pieces = self.predictor.word_pieces(row["tokens"])
            for masked in self._masks(row):
                inputs.append(self.predictor.masked_input(pieces, masked))
                owner.append(r)
        proposals: list[dict[int, list[str]]] = [{} for _ in rows]
        for r, props in zip(owner, self.predictor.propose(inputs, self.cfg.candidates)):
            proposals[r].update(props)
        return [apply_decisions(row, self._decide(row, proposals[r])) for r, row in enumerate(rows)]

    def augment_loop(self, rows: list[dict]) -> list[dict]:
        """The straightforward reference: one sentence, one masked input, one forward pass at a time."""
        results = []
        for row in rows:
            pieces = self.predictor.word_pieces(row["tokens"])
            props: dict[int, list[str]] = {}
            for masked in self._masks(row):
                props.update(self.predictor.propose([self.predictor.masked_input(pieces, masked)],
                                                    self.cfg.candidates)[0])
            results.append(apply_decisions(row, self._decide(row, props)))
        return results
