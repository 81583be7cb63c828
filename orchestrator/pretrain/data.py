"""Instances on disk -> padded tensors for one micro-batch; input checks; the stream of micro-batches.

Pure functions (numpy in, numpy out) so collation is tested without Ray or torch. The parquet
schema is the instances stage's (``orchestrator.core.artifacts.instance_schema``): unpadded
``input_ids``, ``token_type_ids``, ``masked_lm_positions``/``masked_lm_ids`` (empty under
dynamic masking), ``next_sentence_label`` (0 = real next segment, 1 = random). Masks drawn at
load time come from the instances stage's own masking (``orchestrator.instances.masking``), with
the rule the instances manifest records: static and dynamic masking choose targets the same way.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.core.artifacts import INSTANCE_COLUMNS, InstanceInfo
from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.core.manifest import file_sha256
from orchestrator.instances.config import MaskingRule, Specials
from orchestrator.instances.masking import mask_batch

log = logging.getLogger(__name__)
IGNORE_INDEX = -100
LOCAL_INGEST_MAX_BYTES = 256 * 2**20  # pretrain.ingest auto: a phase's instance files up to this are read locally


def masking_rule(info: InstanceInfo) -> MaskingRule:
    """The rule the instances stage recorded for this directory (used when its masking is dynamic)."""
    return MaskingRule(info.masked_lm_prob, info.max_predictions_per_seq, info.whole_word_mask)


def check_vocab_matches(info: InstanceInfo, tokenizer_dir: Path, tokenizer_vocab_size: int) -> None:
    """Refuse instances built with another vocabulary: ids would index the wrong embeddings."""
    vocab_txt = Path(tokenizer_dir) / "vocab.txt"
    if not vocab_txt.is_file():
        raise InputError(tokenizer_dir, "tokenizer directory has no vocab.txt", expected="a WordPiece vocab")
    sha = file_sha256(vocab_txt)
    if sha != info.vocab_sha256 or tokenizer_vocab_size != info.vocab_size:
        raise InputError(info.path / "manifest.json",
                         f"instances were built with another vocabulary (vocab_size {info.vocab_size}, "
                         f"vocab_sha256 {info.vocab_sha256[:12]}) than the tokenizer in {tokenizer_dir} "
                         f"(vocab_size {tokenizer_vocab_size}, vocab_sha256 {sha[:12]})",
                         expected="instances and tokenizer from the same corpus run")


@dataclass(frozen=True)
class StaticShapes:
    """Micro-batches of few shapes (``pretrain.speed.cuda_graphs``): a CUDA graph replays one shape, so
    every row is padded to ``width`` and the packed token and masked position counts are rounded up to
    a multiple of ``tokens`` / ``masked``. The extra positions are filler the loss never reads: extra real
    positions are padding positions (the packed encoder computes them and writes them back to padding),
    extra masked positions are unmasked ones (their label is IGNORE_INDEX, which the loss skips)."""
    width: int
    tokens: int
    masked: int

    @classmethod
    def for_batch(cls, rows: int, width: int) -> StaticShapes:
        """Steps of ``rows x width / 32`` packed tokens and ``/ 256`` masked positions: at 256 x 128 and a
        quarter of padding, 1,024-token buckets (about 2 % extra work) and a handful of shapes."""
        return cls(width, max(8, rows * width // 32), max(8, rows * width // 256))


def _fill(index: np.ndarray, multiple: int, spare: np.ndarray) -> np.ndarray:
    """``index`` followed by the first positions of ``spare``, to a multiple of ``multiple`` (as far as
    ``spare`` goes)."""
    extra = min(-len(index) % multiple, len(spare))
    return np.concatenate([index, spare[:extra]]) if extra else index


def collate(rows: Mapping[str, Sequence], special: Specials, *, rule: MaskingRule | None = None,
            gen: np.random.Generator | None = None, continuation: np.ndarray | None = None,
            pad_to_multiple: int = 1, indices: bool = False,
            shapes: StaticShapes | None = None) -> dict[str, np.ndarray]:
    """Pad a micro-batch (column -> per-row sequences) into model inputs.

    ``labels`` holds the original id at predicted positions and IGNORE_INDEX elsewhere. Static
    instances carry their masks; with a ``rule`` (dynamic masking) the masks are drawn here from
    ``gen`` by ``mask_batch``, a fresh draw every time a row is seen (``continuation``: the ## table
    of ``special``, computed once by the caller, needed for whole-word masking). ``indices`` adds
    ``real_index`` and ``masked_index``, the flat positions (row-major) of the real tokens and of the
    masked ones: found here, on the data thread, the model needs no ``nonzero`` of its own, which on
    CUDA would wait for the GPU (a host sync per micro-batch). ``shapes`` (with ``indices``): rows padded
    to ``shapes.width`` and both index lists filled to its multiples (``StaticShapes``).
    """
    input_rows = rows["input_ids"]
    n = len(input_rows)
    lengths = np.fromiter((len(r) for r in input_rows), dtype=np.int64, count=n)
    width = -(-int(lengths.max()) // pad_to_multiple) * pad_to_multiple
    if shapes is not None and int(lengths.max()) > shapes.width:
        raise OrchestratorError(f"a row of {int(lengths.max())} tokens is longer than the phase's "
                                f"{shapes.width}: the instances were built for longer sequences")
    valid = np.arange(width)[None, :] < lengths[:, None]
    input_ids = np.full((n, width), special.pad, np.int64)
    input_ids[valid] = np.concatenate([np.asarray(r, np.int64) for r in input_rows])
    token_type = np.zeros((n, width), np.int64)
    token_type[valid] = np.concatenate([np.asarray(r, np.int64) for r in rows["token_type_ids"]])
    labels = np.full((n, width), IGNORE_INDEX, np.int64)
    if rule is not None:
        if gen is None:
            raise ValueError("dynamic masking needs a random generator")
        table = continuation if continuation is not None else special.continuation_mask()
        chosen, originals = mask_batch(input_ids, lengths, rule, special, table, gen)
        labels[chosen] = originals
    else:  # every row's (position, id) pairs at once; rows in order, so a repeated position keeps its last id
        positions = [np.asarray(p, np.int64) for p in rows["masked_lm_positions"]]
        if positions and sum(len(p) for p in positions):
            row = np.repeat(np.arange(n), [len(p) for p in positions])
            labels[row, np.concatenate(positions)] = np.concatenate(
                [np.asarray(i, np.int64) for i in rows["masked_lm_ids"]])
    if shapes is not None and shapes.width > width:  # after the masks are drawn: they do not depend on it
        extra = ((0, 0), (0, shapes.width - width))
        input_ids, token_type = np.pad(input_ids, extra, constant_values=special.pad), np.pad(token_type, extra)
        valid, labels = np.pad(valid, extra), np.pad(labels, extra, constant_values=IGNORE_INDEX)
    batch = {"input_ids": input_ids, "token_type_ids": token_type, "attention_mask": valid.astype(np.int64),
             "labels": labels, "next_sentence_label": np.asarray(rows["next_sentence_label"], np.int64)}
    if indices:
        batch["real_index"] = np.flatnonzero(valid)
        batch["masked_index"] = np.flatnonzero(labels != IGNORE_INDEX)
        if shapes is not None:
            batch["real_index"] = _fill(batch["real_index"], shapes.tokens, np.flatnonzero(~valid))
            batch["masked_index"] = _fill(batch["masked_index"], shapes.masked, np.flatnonzero(labels == IGNORE_INDEX))
    return batch


# ------------------------------------------------------------------------------------- the stream
def instance_files(directory: Path) -> list[Path]:
    """An instances directory's parquet files, in name order (the order both readers read them in)."""
    return sorted(Path(directory).glob("*.parquet"))


def check_instance_files(info: InstanceInfo) -> None:
    """An instances directory's parquet parts hold the instances its manifest counts, each part readable (its
    footer): a part missing or cut short (a copy interrupted) is refused naming it, by the dry run and before
    Ray. A probe (session 49) trained on 95 % of a directory with one part gone, exit 0; after the part was put
    back the model was reused, its key being the manifest's. Read from the footers: milliseconds a part."""
    if info.instances is None:  # a manifest without the count (an older one): nothing to compare with
        return
    import pyarrow.parquet as pq  # heavy: pyarrow

    files, rows = instance_files(info.path), 0
    for file in files:
        try:
            rows += pq.read_metadata(file).num_rows
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise InputError(file, f"not a readable parquet part ({exc})",
                             expected="the part the instances stage wrote: copy the directory again") from None
    if rows != info.instances:
        raise InputError(info.path, f"its {len(files)} parquet part(s) hold {rows:,} instances where its "
                                    f"manifest.json counts {info.instances:,}: a part is missing or is another's",
                         expected="the instances stage's whole output: copy the directory again")


def resolve_ingest(setting: str, files: Sequence[Path]) -> str:
    """``pretrain.ingest`` for one phase: ``local`` or ``ray_data`` (``auto``: local up to
    ``LOCAL_INGEST_MAX_BYTES`` of files)."""
    if setting != "auto":
        return setting
    return "local" if sum(f.stat().st_size for f in files) <= LOCAL_INGEST_MAX_BYTES else "ray_data"


class LocalShard:
    """A worker's share of a phase's instances, read by the worker itself (``pretrain.ingest: local``):
    rows ``[rank x n, (rank + 1) x n)`` of the files read in name order, ``n`` = rows // world, as Ray
    Data's ``split(world, equal=True)`` shares them. ``iter_batches`` takes Ray Data's arguments and
    shuffles the whole share with ``local_shuffle_seed`` (an epoch's order depends on its seed alone, so
    a resume re-reads it exactly)."""

    def __init__(self, files: Sequence[str | Path], rank: int, world: int):
        import pyarrow as pa  # heavy: pyarrow
        import pyarrow.parquet as pq

        if not files:
            raise OrchestratorError("no instance files to read")
        # only the files that hold the share (their footers say how many rows each has), one at a time, as flat
        # arrays: every worker read every file, and kept its rows as one small array each (probe G3: a share of
        # 157 MB of files took 977 MB of a worker's memory)
        counts = [pq.ParquetFile(f).metadata.num_rows for f in files]
        n = sum(counts) // world
        start, parts, offset = rank * n, [], 0
        for path, count in zip(files, counts):
            low, high = max(start, offset), min(start + n, offset + count)
            if low < high or (path == files[-1] and not parts):  # (an empty share keeps the columns' types)
                table = pq.read_table(path, columns=list(INSTANCE_COLUMNS))
                parts.append(_flat(table.slice(min(low - offset, count), max(0, high - low))))
                del table
                pa.default_memory_pool().release_unused()
            offset += count
        self.rows = n
        self.columns = {c: _Lists.joined([p[c] for p in parts]) if isinstance(parts[0][c], tuple)
                        else np.concatenate([p[c] for p in parts]) for c in INSTANCE_COLUMNS}

    def iter_batches(self, *, batch_size: int, batch_format: str = "numpy", drop_last: bool = True,
                     prefetch_batches: int = 0, local_shuffle_buffer_size: int | None = None,
                     local_shuffle_seed: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        if batch_format != "numpy":
            raise ValueError(f"LocalShard gives numpy batches, not {batch_format}")
        order = (np.random.default_rng(local_shuffle_seed).permutation(self.rows) if local_shuffle_buffer_size
                 else np.arange(self.rows))
        end = self.rows - self.rows % batch_size if drop_last else self.rows
        for i in range(0, end, batch_size):
            picked = order[i:i + batch_size]
            yield {c: v[picked] for c, v in self.columns.items()}


def _flat(table) -> dict:
    """A table's columns as numpy copies: a list column as (its values, each row's length), a scalar one as it is."""
    import pyarrow as pa  # heavy: pyarrow

    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_list(column.type):
            out[name] = (column.flatten().to_numpy().copy(), np.diff(column.offsets.to_numpy()))
        else:
            out[name] = column.to_numpy().copy()
    return out


class _Lists:
    """A list column of a worker's share as its flat values and offsets, a row a view of the values: as one small
    array a row (``to_numpy`` of the column) it took several times the files' size (probe G3). Indexed by an array
    of rows it gives what ``to_numpy`` gave, an object array of the rows' arrays."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray):
        self.values = values
        self.offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    @classmethod
    def joined(cls, parts: list[tuple[np.ndarray, np.ndarray]]) -> _Lists:
        return cls(np.concatenate([v for v, _ in parts]), np.concatenate([n for _, n in parts]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, rows) -> np.ndarray:
        out = np.empty(len(rows), dtype=object)
        for j, i in enumerate(rows):
            out[j] = self.values[self.offsets[i]:self.offsets[i + 1]]
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self[np.arange(len(self))])


def micro_batches(shard, device_batch: int, special: Specials, rule: MaskingRule | None, *, seed: int,
                  seed_key: Sequence[int], prefetch: int = 2, pad_to: int = 1,
                  start: Mapping[str, Any] | None = None,
                  shapes: StaticShapes | None = None) -> Iterator[tuple[dict[str, np.ndarray], dict]]:
    """Endless stream of collated micro-batches from a worker's Ray Data shard or ``LocalShard`` (anything
    with ``iter_batches``), epoch after epoch, each with its position: the stream's state just after it.

    Epoch ``e`` reads the shard locally shuffled with seed ``seed + e`` and, under dynamic masking
    (``rule``), draws its masks from ``np.random.default_rng((seed, *seed_key, e))``. A position is
    ``{"seed_key", "epoch", "batches" (of that epoch, so far), "rng" (the mask generator's state)}``;
    given one as ``start`` the stream goes on from there: it reads past the batches already
    produced in that epoch (no collation, no masking) and restores the generator, so it yields what
    the uninterrupted stream would have yielded next, as long as the shard's rows come in the same
    order (``ordered_ingest``). ``shapes``: ``collate``'s static shapes (``speed.cuda_graphs``).
    """
    continuation = special.continuation_mask()
    key = tuple(int(k) for k in (start["seed_key"] if start else seed_key))
    epoch = int(start["epoch"]) if start else 0
    skip = int(start["batches"]) if start else 0
    while True:
        gen = np.random.default_rng((seed, *key, epoch))
        if skip:
            gen.bit_generator.state = start["rng"]
            log.info("data: going on from batch %d of epoch %d (reading past the batches already trained on)",
                     skip, epoch)
        produced = 0
        for rows in shard.iter_batches(batch_size=device_batch, batch_format="numpy", drop_last=True,
                                       prefetch_batches=prefetch, local_shuffle_buffer_size=device_batch * 4,
                                       local_shuffle_seed=seed + epoch):
            produced += 1
            if produced <= skip:
                continue
            batch = collate(rows, special, rule=rule, gen=gen, continuation=continuation, pad_to_multiple=pad_to,
                            indices=True, shapes=shapes)
            yield batch, {"seed_key": list(key), "epoch": epoch, "batches": produced, "rng": gen.bit_generator.state}
        if produced == 0:
            raise OrchestratorError(f"a worker's data shard yielded no full batch of {device_batch} sequences")
        epoch, skip = epoch + 1, 0


_ITEM, _END, _ERROR = "item", "end", "error"


class Prefetcher:
    """Runs an iterator on a background thread, at most ``depth`` items ahead of its consumer.

    The training loop's micro-batches are read, collated, masked (and pinned, on CUDA) here while the
    accelerator runs the previous step, instead of on the training thread between steps. The items
    and their order are the iterator's own (it runs on one thread, start to end); ``transform`` is
    applied on the background thread. An error there is raised on the consumer's next ``next()``.
    ``close()`` (or leaving a ``with`` block) stops the thread and closes the iterator.
    """

    def __init__(self, source: Iterator, depth: int, transform: Callable[[Any], Any] | None = None,
                 name: str = "prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(source, transform), name=name, daemon=True)
        self._thread.start()

    def _run(self, source: Iterator, transform) -> None:
        try:
            for item in source:
                if not self._put((_ITEM, transform(item) if transform else item)):
                    return
            self._put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put((_ERROR, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, message) -> bool:
        """Blocks while the queue is full; False once the consumer has closed the prefetcher."""
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise OrchestratorError("the data thread stopped without a word") from None
        if kind == _ITEM:
            return value
        self._finished = True
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self, timeout: float = 30.0) -> bool:
        """Stop the thread; True when it has ended within ``timeout`` seconds. A thread still inside a
        read is left to end on its own (a daemon): e.g. a Ray Data split that has reached its epoch's end
        waits there for the other workers' splits, which stopped reading at the same phase end."""
        self._stop.set()
        self._finished = True
        while True:  # free a producer blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.info("data: the prefetch thread %s is still inside a read after %gs; left to end on its own",
                     self._thread.name, timeout)
            return False
        return True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ordered_ingest():
    """Ray Train's dataset options with ``preserve_order``: a worker's shard then holds the same rows in
    the same order in every run, so a resumed run reads what the interrupted one would have read
    next. (Without it blocks are handed to the workers as their reads finish, and locality hints
    move them between nodes; in order, a multi-node run may move more data between nodes.)"""
    from ray.train import DataConfig  # heavy: ray

    options = DataConfig.default_ingest_options()
    options.preserve_order = True
    return DataConfig(execution_options=options)
