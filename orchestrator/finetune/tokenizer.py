"""A trial's tokenizer without transformers in the worker: the driver's copy of a model's fast tokenizer.

    write_worker_tokenizers(cache_dir, model_dirs)     # the sweep's driver, before its trials start
    tokenizer = load_tokenizer(model_dir, cache_dir)   # a trial: the driver's copy, else ``AutoTokenizer``

Why: a sweep's worker process imported transformers only to read its model's tokenizer and config: 0.8 s of the
2.7 s of imports each worker pays before its first trial trains (``benchmarks/sweep_overhead.py``; the config
is ``orchestrator.modeling.bert.BertSettings``). A fast tokenizer's work is its ``tokenizers`` backend;
transformers' call around it sets the truncation (``longest_first`` to ``max_length``, on the tokenizer's
side), reads an empty second text as none and asks the backend for the ids with the special tokens. The
driver, which has transformers imported (the job's has, when its sweep starts), loads each model's tokenizer
as ``AutoTokenizer`` and writes its backend, with what the call reads of the tokenizer, into the sweep's cache
under a name of the tokenizer's files and the libraries' releases (``spec_path``); a worker reads it with
``tokenizers`` alone (``WorkerTokenizer``).

The driver writes a copy only where the copy, as the worker reads it, gives what transformers gives on probe
texts (pairs and single texts, words, cuts, accents, CJK, special tokens, control characters) and what the
encoding cache's key reads (``finetune.encoding``: the class, lower-casing, the vocabulary and the backend's
settings), so the token ids and the cached splits are the same either way (``tests/test_finetune_tokenizer.py``).
Where it writes none (a slow tokenizer, a check that fails, a trial run without a sweep's cache), the trial
loads ``AutoTokenizer`` as before.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.core.manifest import atomic_write_json, file_sha256, library_versions
from orchestrator.core.reuse import TOKENIZER_FILES, content_key

log = logging.getLogger(__name__)

#: what ``AutoTokenizer.from_pretrained`` reads of a model directory (config.json: the class, where
#: tokenizer_config.json names none)
READ_FILES = (*TOKENIZER_FILES, "added_tokens.json", "config.json")
FORMAT = 1
OUTPUTS = ("input_ids", "token_type_ids", "attention_mask")
#: what the check tokenises with both (single texts, pairs, and words as NER gives them), at a cut and without one
PROBE_TEXTS = ("The patient's BRCA1 c.68_69delAG variant was seen in 3/12 cases (25%).",
               "Café naïve résumé Ärzte ﬁbrosis ΑΒΓ αβγ", "中文字符 和 ひらがな 한국어 mixed-in text",
               "[CLS] a [MASK] token [SEP] and [PAD] [UNK] inside", "tabs\tnew\nlines\u200bzero\u00adsoft  spaces",
               "", "x", " ".join(["acetylsalicylic"] * 40))
PROBE_LENGTHS = (8, 13, 512)


def spec_path(cache_dir: str | Path, model_dir: str | Path) -> Path:
    """Where the driver's copy of ``model_dir``'s tokenizer lies: named by the files transformers reads and the
    releases of transformers and tokenizers (either may change what the tokenizer is)."""
    model_dir = Path(model_dir)
    files = {name: file_sha256(model_dir / name) for name in READ_FILES if (model_dir / name).is_file()}
    versions = {lib: library_versions().get(lib, "") for lib in ("transformers", "tokenizers")}
    return Path(cache_dir) / "tokenizers" / f"{content_key([FORMAT, files, versions])}.json"


class WorkerTokenizer:
    """A fast tokenizer's backend with what transformers' call adds (the module's docstring), for what fine-tuning
    asks of a tokenizer: ``tok(text, pair, truncation=True, max_length=n)``, ``tok(words,
    is_split_into_words=True, ...)`` with ``word_ids()``, ``pad_token_id``, and the encoding cache's key."""

    def __init__(self, spec: dict[str, Any]):
        from tokenizers import Tokenizer  # heavy: tokenizers (a Rust extension: 0.02 s)

        self.backend_tokenizer = Tokenizer.from_str(spec["backend"])
        self.backend_tokenizer.no_padding()
        self.backend_tokenizer.encode_special_tokens = spec["split_special_tokens"]
        self.class_name, self.do_lower_case = spec["class"], spec["do_lower_case"]
        self.pad_token_id, self.truncation_side = spec["pad_token_id"], spec["truncation_side"]
        self.outputs = tuple(spec["outputs"])

    @classmethod
    def from_file(cls, path: Path) -> WorkerTokenizer:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        if spec.get("format") != FORMAT:
            raise ValueError(f"{path}: format {spec.get('format')!r}, expected {FORMAT}")
        return cls(spec)

    def __call__(self, text: str | list[str], text_pair: str | None = None, *, truncation: bool = True,
                 max_length: int | None = None, is_split_into_words: bool = False) -> Encoding:
        if not truncation or max_length is None:
            self.backend_tokenizer.no_truncation()
        else:
            self.backend_tokenizer.enable_truncation(max_length, stride=0, strategy="longest_first",
                                                     direction=self.truncation_side)
        batch = [(text, text_pair)] if text_pair else [text]  # as transformers: an empty second text is none
        (encoding,) = self.backend_tokenizer.encode_batch(batch, add_special_tokens=True,
                                                          is_pretokenized=is_split_into_words)
        return Encoding(encoding, self.outputs)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)


class Encoding(dict):
    """One input's ids as transformers' ``BatchEncoding`` gives them, with its ``word_ids()``."""

    def __init__(self, encoding: Any, outputs: tuple[str, ...]):
        fields = {"input_ids": encoding.ids, "token_type_ids": encoding.type_ids,
                  "attention_mask": encoding.attention_mask}
        super().__init__({name: fields[name] for name in outputs})
        self._word_ids = encoding.word_ids

    def word_ids(self) -> list[int | None]:
        return self._word_ids


def class_name(tokenizer: Any) -> str:
    """The tokenizer's class as the encoding cache's key names it: a copy names the class it copies."""
    return getattr(tokenizer, "class_name", None) or type(tokenizer).__name__


def tokenizer_settings(tokenizer) -> dict:
    """What turns text into ids besides the vocabulary: a fast tokenizer's normalizer (lower-casing, accent
    stripping), pre-tokenizer, post-processor, special tokens and WordPiece settings. Two models with one
    vocabulary and other settings shared their cached token ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: its settings are its init arguments
        return {k: v for k, v in sorted(tokenizer.init_kwargs.items())
                if isinstance(v, bool | int | float | str) and k not in ("name_or_path", "vocab_file")}
    state = json.loads(backend.to_str())
    model = {k: v for k, v in state.get("model", {}).items() if k != "vocab"}
    return {"model": model, **{k: state.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor",
                                                         "added_tokens")}}


def _spec(tokenizer: Any) -> dict[str, Any] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: transformers' Python does the work
        return None
    names = getattr(tokenizer, "model_input_names", OUTPUTS)
    return {"format": FORMAT, "class": type(tokenizer).__name__,
            "do_lower_case": getattr(tokenizer, "do_lower_case", None),
            "pad_token_id": tokenizer.pad_token_id, "truncation_side": tokenizer.truncation_side,
            "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
            "outputs": [name for name in OUTPUTS if name == "input_ids" or name in names],
            "backend": backend.to_str()}


def differences(tokenizer: Any, copy: WorkerTokenizer) -> list[str]:
    """What ``copy`` tokenises or keys otherwise than transformers' ``tokenizer`` (none: the copy can stand in)."""
    found = []
    for name, mine, theirs in (("class", class_name(copy), class_name(tokenizer)),
                               ("do_lower_case", copy.do_lower_case, getattr(tokenizer, "do_lower_case", None)),
                               ("pad_token_id", copy.pad_token_id, tokenizer.pad_token_id),
                               ("vocabulary", copy.get_vocab(), tokenizer.get_vocab()),
                               ("settings", tokenizer_settings(copy), tokenizer_settings(tokenizer))):
        if mine != theirs:
            found.append(name)
    words = [text.split() or [""] for text in PROBE_TEXTS]
    calls = [((a,), {}) for a in PROBE_TEXTS] + [((a, b), {}) for a in PROBE_TEXTS for b in PROBE_TEXTS[::3]] + \
        [((w,), {"is_split_into_words": True}) for w in words]
    checked = 0
    for args, kwargs in calls:
        for length in PROBE_LENGTHS:
            try:
                theirs = tokenizer(*args, truncation=True, max_length=length, **kwargs)
            except Exception:  # noqa: BLE001 (a cut transformers refuses: the copy need not give it)
                continue
            checked += 1
            mine = copy(*args, truncation=True, max_length=length, **kwargs)
            if dict(mine) != {k: list(v) for k, v in theirs.items()} or \
                    (kwargs and mine.word_ids() != theirs.word_ids()):
                found.append(f"tokens of {args!r} at {length}")
    return found if checked else [*found, "no probe text tokenised by transformers"]


def write_worker_tokenizers(cache_dir: str | Path, model_dirs: Iterable[str | Path]) -> int:
    """Write the copy of each model directory's tokenizer that its trials' workers read (``spec_path``), where
    none is there and the copy stands in for transformers' (``differences``). Returns how many were written."""
    written = 0
    for model_dir in sorted({str(d) for d in model_dirs}):
        path = spec_path(cache_dir, model_dir)
        if path.is_file():
            with contextlib.suppress(OSError):  # used by this run: kept by the cache's pruning (prune_encoded)
                os.utime(path)
            continue
        try:
            from transformers import AutoTokenizer  # heavy: transformers (the job's driver has it imported)

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            spec = _spec(tokenizer)
            found = ["a slow tokenizer"] if spec is None else differences(tokenizer, WorkerTokenizer(spec))
        except Exception as exc:  # noqa: BLE001 (the trial loads it as always, and says what is wrong)
            found = [f"{type(exc).__name__}: {exc}"]
        if found:
            log.info("tokenizer of %s: no copy for the workers (%s): its trials load it with transformers", model_dir,
                     ", ".join(found[:3]))
            continue
        atomic_write_json(path, spec)
        written += 1
    return written


def load_tokenizer(model_dir: str, cache_dir: str = "") -> Any:
    """``model_dir``'s tokenizer for a trial: the driver's copy in ``cache_dir`` where there is one, else
    transformers' ``AutoTokenizer``."""
    if cache_dir:
        path = spec_path(cache_dir, model_dir)
        if path.is_file():
            try:
                return WorkerTokenizer.from_file(path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("tokenizer copy %s unreadable (%s): loading %s with transformers", path, exc, model_dir)
    from transformers import AutoTokenizer  # heavy: transformers

    return AutoTokenizer.from_pretrained(model_dir)


__all__ = ["Encoding", "WorkerTokenizer", "class_name", "differences", "load_tokenizer", "spec_path",
           "tokenizer_settings", "write_worker_tokenizers"]
