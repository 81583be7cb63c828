"""The artifacts that cross stages, in one place both sides import.

A stage writes its output directory; the next stage reads it. What such a directory holds is
defined here, not in either stage, so that neither has to import the other:

- the corpus stage's shards and mixing plan (``shards.json``, ``plan.json``): ``ShardInfo``,
  ``Unit``/``Member``/``MixPlan``, written by ``write_plan`` and read by ``load_plan``;
  the sentences of its shard files, read by ``shard_sentences`` (the vocabulary stage);
- the instances stage's parquet schema (``instance_schema``) and its manifest's promises
  (``InstanceInfo``, read by ``read_instance_info``: the pretraining stage).

The results document of a sweep is ``orchestrator.core.results``.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.manifest import (
    atomic_write_json,
    atomic_write_json_list,
    atomic_write_text,
    iter_json_list,
    read_json_object,
    read_manifest,
)

#: Source roles on the small (in-domain) side of SimPT, AmpV and MDAPT; every other role is the large side.
SMALL_ROLES = ("small", "domain")
#: Columns of a corpus shard file (one row per document).
SHARD_COLUMNS = ("source", "doc_id", "page", "language", "sentences", "n_bytes")
#: Columns of an instances shard that training reads (``source`` and ``language`` are provenance only).
INSTANCE_COLUMNS = ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_label")
#: Instance creation carries one provenance label per document, ``source`` + LABEL_SEP + ``language``
#: (a source name never holds it), and splits it again into the two columns of the instances.
LABEL_SEP = "\x1f"


def provenance_label(source: str, language: str) -> str:
    return f"{source}{LABEL_SEP}{language}" if language else source


def label_parts(label: str) -> tuple[str, str]:
    """(source, language) of a provenance label; language "" for a label without one."""
    source, _, language = label.partition(LABEL_SEP)
    return source, language


class PackedStrings(Sequence[str]):
    """A read-only sequence of strings kept as one UTF-8 buffer and each string's end offset: about a byte
    a character plus 8 bytes, where a tuple of ``str`` costs about 57 bytes plus the characters. A corpus
    build holds every document's page (by default its ``doc_id``, e.g. ``pubmed:0:123456``) until the plan
    is written: 30M abstracts are about 0.7 GB of driver memory this way, 2.2 GB as a tuple. Equal to any
    sequence of the same strings."""

    __slots__ = ("_data", "_ends")

    def __init__(self, strings: Iterable[str] = ()):
        data, ends = bytearray(), array("q")
        for s in strings:
            data += s.encode("utf-8", "surrogatepass")
            ends.append(len(data))
        self._data, self._ends = bytes(data), ends

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        end = self._ends[i]  # IndexError as a tuple's
        i = i + len(self) if i < 0 else i
        return self._data[self._ends[i - 1] if i else 0:end].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        start = 0
        for end in self._ends:
            yield self._data[start:end].decode("utf-8", "surrogatepass")
            start = end

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedStrings):
            return self._ends == other._ends and self._data == other._data
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedStrings({list(self)!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class ShardInfo:
    """One shard file of one source, with per-document sizes (MDAPT selects documents). The per-document
    fields are compact sequences (``PackedStrings``, 8-byte arrays: ``shard_info``) where a corpus of tens of
    millions of documents is held; they compare equal to tuples of the same values."""

    path: str
    source: str
    role: str
    language: str
    n_bytes: int
    pages: Sequence[str]
    doc_sentences: Sequence[int]
    doc_bytes: Sequence[int]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardInfo):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    def to_json(self) -> dict:
        """The shard as ``shards.json`` lists it (lists, not the compact sequences)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: list(value) if name in PER_DOCUMENT else value for name, value in fields.items()}

    @property
    def n_docs(self) -> int:
        return len(self.doc_sentences)

    @property
    def n_sentences(self) -> int:
        return sum(self.doc_sentences)

    @property
    def is_small(self) -> bool:
        return self.role in SMALL_ROLES


#: ShardInfo's per-document fields
PER_DOCUMENT = ("pages", "doc_sentences", "doc_bytes")


def shard_info(pages: Iterable[str], doc_sentences: Iterable[int], doc_bytes: Iterable[int], **fields) -> ShardInfo:
    """A ``ShardInfo`` whose per-document fields are compact: pages packed, the counts 8-byte arrays (the corpus
    build's private driver memory 61 B a document where tuples of Python objects made it 101:
    ``benchmarks/corpus_driver_memory.py``)."""
    return ShardInfo(pages=PackedStrings(pages), doc_sentences=array("q", doc_sentences),
                     doc_bytes=array("q", doc_bytes), **fields)


def _same(a: object, b: object) -> bool:
    """Field equality where an array and a tuple of the same numbers are the same."""
    if isinstance(a, array) or isinstance(b, array):
        return isinstance(a, Sequence) and isinstance(b, Sequence) and list(a) == list(b)
    return a == b


@dataclasses.dataclass(frozen=True)
class Member:
    """A shard taken into a unit: all its documents, or only the listed rows."""

    path: str
    rows: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Unit:
    unit_id: int
    members: tuple[Member, ...]
    dupe_factor: int


@dataclasses.dataclass(frozen=True)
class MixPlan:
    """A mixer's units. Each unit's instances go to ``part-<unit_id>.parquet``: the ids must differ, or one
    unit's part replaces another's."""
    units: tuple[Unit, ...]
    notes: dict

    def __post_init__(self):
        if repeated := _repeated_ids(self.units):
            raise ValueError(f"a mix plan's unit ids repeat: {repeated}")


def _repeated_ids(units: Sequence[Unit]) -> str:
    """The ids given to more than one unit, as ``unit id 0 x 6, ...``; empty when every id is its own."""
    counts = collections.Counter(u.unit_id for u in units)
    return ", ".join(f"unit id {i} x {n}" for i, n in sorted(counts.items()) if n > 1)


# ---------------------------------------------------------------------------------------------
# The corpus stage's output

def write_plan(corpus_dir: Path, shards: Sequence[ShardInfo], plan: MixPlan) -> None:
    """``shards.json`` and ``plan.json`` (shard paths relative to ``corpus_dir``)."""
    atomic_write_json_list(corpus_dir / "shards.json", (s.to_json() for s in shards))  # millions of documents
    atomic_write_json(corpus_dir / "plan.json", {"units": [dataclasses.asdict(u) for u in plan.units],
                                                 "notes": plan.notes})


def load_plan(corpus_dir: Path, documents: bool = True) -> tuple[list[ShardInfo], MixPlan]:
    """Shards and units of a finished corpus stage, with shard paths made absolute. ``shards.json`` is read
    a shard at a time (it lists every document: tens of millions for a whole PubMed). ``documents`` False
    (the vocabulary and instance stages, which select no documents): each shard's ``pages`` are left out.
    The per-document fields are compact either way (``shard_info``: 8-byte arrays, not tuples of Python
    ints, about 16 bytes a document instead of about 130)."""
    corpus_dir = Path(corpus_dir)
    shards = [shard_info(**{**s, "path": str(corpus_dir / s["path"]), "pages": s["pages"] if documents else ()})
              for s in iter_json_list(corpus_dir / "shards.json")]
    raw = json.loads((corpus_dir / "plan.json").read_text())
    units = tuple(Unit(u["unit_id"], tuple(Member(str(corpus_dir / m["path"]),
                                                  tuple(m["rows"]) if m["rows"] is not None else None)
                                           for m in u["members"]), u["dupe_factor"]) for u in raw["units"])
    if repeated := _repeated_ids(units):  # the weighted mixer before session 52
        raise InputError(corpus_dir / "plan.json", f"units with the same id ({repeated}): each unit's "
                         "instances would replace another's, as the weighted mixer's full passes did before its "
                         "fix (their instances were lost)",
                         expected="a corpus built by this version: remove this corpus stage's folder and the "
                                  "instances built from it, and run again to rebuild them")
    return shards, MixPlan(units, raw["notes"])


def shard_sentences(paths: Sequence[str]) -> Iterator[str]:
    """Every sentence of the given shard files, streamed in file order."""
    import pyarrow.parquet as pq  # heavy: pyarrow

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["sentences"], batch_size=512):
            for doc in batch.column(0).to_pylist():
                yield from doc


# ---------------------------------------------------------------------------------------------
# The instances stage's output

def instance_schema():
    """One row per instance: unpadded ids (masked already under static masking), segment ids,
    masked positions and original ids (empty under dynamic masking), the NSP label (0 = B is the
    real next segment, 1 = random, HF's convention), and the source and language of segment A's
    document (language "" for shards written without one)."""
    import pyarrow as pa  # heavy: pyarrow

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
                      ("masked_lm_positions", pa.list_(pa.int32())), ("masked_lm_ids", pa.list_(pa.int32())),
                      ("next_sentence_label", pa.int8()), ("source", pa.string()), ("language", pa.string())])


def pair_cut_share(counts: dict) -> float | None:
    """The share of the packed pair tokens (segments A and B as packed, before ``truncate_seq_pair``) that
    truncation cut, from an instances manifest's ``counts``; None for a manifest from before the count
    (``pair_tokens_cut`` absent), whose share is unknown."""
    cut = counts.get("pair_tokens_cut")
    if cut is None or not counts.get("instances"):
        return None
    packed = counts["tokens"] - 3 * counts["instances"] + cut  # [CLS] A [SEP] B [SEP]: three special tokens
    return cut / packed if packed else 0.0


def pair_cut_text(counts: dict) -> str:
    """The cut in words (the stage's log line, a chain's summary): tokens, share, instances; unknown for a
    manifest from before the count."""
    share = pair_cut_share(counts)
    if share is None:
        return "truncation cut: unknown (instances made before the cut was counted)"
    return (f"truncation cut {counts['pair_tokens_cut']:,} pair tokens ({share:.1%} of those packed) from "
            f"{counts.get('pairs_cut', 0):,} instances ({counts.get('pairs_cut', 0) / counts['instances']:.1%})")


@dataclasses.dataclass(frozen=True)
class InstanceInfo:
    """What an instances directory promises, read from its manifest."""
    path: Path
    max_seq_length: int
    masking: str
    vocab_size: int
    vocab_sha256: str
    instances: int | None
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_mask: bool = False


def read_instance_info(path: Path) -> InstanceInfo:
    """Read and check an instances directory's manifest (counts/extra hold the stage's promises)."""
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        raise InputError(path, "not a finished instances directory",
                         expected="manifest.json from the instances stage") from None
    file = path / "manifest.json"
    sections = {k: manifest.get(k) or {} for k in ("counts", "extra")}
    bad = [k for k, v in sections.items() if not isinstance(v, dict)]
    if bad:
        raise InputError(file, f"{bad[0]} is a JSON {type(sections[bad[0]]).__name__}", expected="a JSON object")
    merged = {**sections["counts"], **sections["extra"], **manifest}
    missing = [k for k in ("max_seq_length", "masking", "vocab_size", "vocab_sha256") if k not in merged]
    if missing:
        raise InputError(file, f"missing {', '.join(missing)}",
                         expected="counts/extra with max_seq_length, masking, vocab_size, vocab_sha256")
    if merged["masking"] not in ("static", "dynamic"):
        raise InputError(file, f"masking is {merged['masking']!r}",
                         expected="'static' or 'dynamic'")
    if not list(path.glob("*.parquet")):
        raise InputError(path, "no parquet shards", expected="part-*.parquet")
    try:
        return InstanceInfo(path, int(merged["max_seq_length"]), str(merged["masking"]), int(merged["vocab_size"]),
                            str(merged["vocab_sha256"]), merged.get("instances"),
                            float(merged.get("masked_lm_prob", 0.15)), int(merged.get("max_predictions_per_seq", 20)),
                            bool(merged.get("whole_word_mask", False)))
    except (TypeError, ValueError) as exc:
        raise InputError(file, f"a value of the wrong type ({exc})",
                         expected="whole numbers max_seq_length, vocab_size and max_predictions_per_seq, a number "
                                  "masked_lm_prob") from None


#: What a Hugging Face BERT directory must hold to load: weights, and a tokenizer vocabulary.
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model.bin", "*.index.json")
MODEL_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


#: Options transformers' tokenizer save writes into tokenizer_config.json that say how it was loaded, not what it is
LOAD_OPTIONS = ("is_local", "local_files_only")


#: Model types whose position ids start after the padding index (``create_position_ids_from_input_ids``)
ROBERTA_STYLE = frozenset({"roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "xlm-roberta-xl"})


def usable_positions(config: dict) -> int | None:
    """The longest input a model with this ``config.json`` embeds: ``max_position_embeddings``, less the padding
    index + 1 for a RoBERTa-style model (RoBERTa's 514 hold 512 tokens); None when the config does not say."""
    positions, pad = config.get("max_position_embeddings"), config.get("pad_token_id")
    if not isinstance(positions, int):
        return None
    return positions - pad - 1 if config.get("model_type") in ROBERTA_STYLE and isinstance(pad, int) else positions


def write_vocab_txt(model_dir: str | Path, vocab: dict[str, int]) -> None:
    """A WordPiece vocabulary (token -> id) as ``model_dir``'s vocab.txt, one token a line in id order: what
    tools that read BERT's vocabulary file need where transformers 5 saved tokenizer.json alone."""
    atomic_write_text(Path(model_dir) / "vocab.txt",
                      "".join(f"{token}\n" for token, _ in sorted(vocab.items(), key=lambda item: item[1])))


def limit_tokenizer(model_dir: str | Path, positions: int) -> None:
    """Set the tokenizer's ``model_max_length`` in ``model_dir``'s tokenizer_config.json to the model's
    ``positions`` (it was transformers' "no limit", 1e30: ``truncation=True`` in plain transformers then cut
    nothing, and a long text failed in the model), and drop the loading options saved with it."""
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    limit = config.get("model_max_length")
    config = {k: v for k, v in config.items() if k not in LOAD_OPTIONS}
    if not isinstance(limit, int) or limit > positions:
        config["model_max_length"] = positions
    atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def check_model(name: str, model_dir: str | Path, *, tokenizer: bool = True, segment_b: str = "") -> dict:
    """What a model directory holds, read from its files alone (no weights loaded); InputError naming
    the directory when it cannot be a BERT encoder with its tokenizer. ``tokenizer=False``: the caller
    brings its own tokenizer (pretraining's ``tokenizer_dir``), so the directory needs none. ``segment_b``:
    what gives the model token type id 1, which it must embed (``check_token_types``)."""
    model_dir = Path(model_dir)
    expected = "a Hugging Face BERT directory: config.json, safetensors weights, tokenizer files"
    if not model_dir.is_dir():
        raise InputError(model_dir, f"model {name}: directory not found", expected=expected)
    if not (model_dir / "config.json").is_file():
        raise InputError(model_dir, f"model {name}: no config.json", expected=expected)
    config = read_json_object(model_dir / "config.json", "a Hugging Face model config, a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        said = "no model_type" if model_type is None else f"model_type is {model_type!r}"
        raise InputError(model_dir / "config.json", f"model {name}: {said}",
                         expected="the model's type, e.g. model_type 'bert' (transformers 5 loads a model by it)")
    if config.get("position_embedding_type") in ("relative_key", "relative_key_query"):
        raise InputError(model_dir / "config.json", f"model {name}: position_embedding_type is "
                         f"{config['position_embedding_type']!r}, which transformers 5 no longer implements (the "
                         "model would load with absolute positions, its distance_embedding weights dropped)",
                         expected="position_embedding_type 'absolute'")
    if not any(any(model_dir.glob(p)) for p in WEIGHT_PATTERNS):  # a glob is a generator: always true
        raise InputError(model_dir, f"model {name}: no weights file", expected="model.safetensors")
    if tokenizer and not any((model_dir / f).is_file() for f in MODEL_TOKENIZER_FILES):
        raise InputError(model_dir, f"model {name}: no tokenizer (tokenizer.json or vocab.txt)", expected=expected)
    if segment_b:
        check_token_types(name, model_dir, segment_b)
    return {"model_type": model_type, "layers": config.get("num_hidden_layers"),
            "hidden": config.get("hidden_size"), "max_position_embeddings": config.get("max_position_embeddings"),
            "vocab_size": config.get("vocab_size"), "architectures": config.get("architectures") or []}


def check_token_types(name: str, model_dir: str | Path, use: str) -> None:
    """InputError naming the model's config.json when ``use`` (a sentence-pair task, pretraining's segment B)
    would give a BERT token type id 1 it has no embedding for: ``type_vocab_size`` 1 (every batch then fails on
    an IndexError). RoBERTa-style models, saved with 1, are left alone: their tokenizers give no token types."""
    path = Path(model_dir) / "config.json"
    config = read_json_object(path, "a Hugging Face model config, a JSON object")
    types = config.get("type_vocab_size", 2)  # BertConfig's default
    if config.get("model_type") == "bert" and not (isinstance(types, int) and types >= 2):
        raise InputError(path, f"model {name}: type_vocab_size is {types!r}: no embedding for token type id 1 "
                               f"(segment B), which {use} give it", expected="type_vocab_size >= 2, BERT's 2")
