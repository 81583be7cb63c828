"""The one owner of seed 004's scoring settings and of the key its scores are reused by.

Every way of scoring sources (``jobs/score_sources.py``: ``SelectionConfig``; an experiment's
arms: ``ArmScoringConfig``, the ``selection:`` section; ``jobs/propose_mix.py``: its config) is a
``ScoringSettings``: the same six fields, written flat in the YAML as before, checked in one place.
``scoring_key`` names what a score depends on, whoever asks.

This module imports no numpy: configs load without the scoring's heavy imports.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import hash_inputs
from orchestrator.core.reuse import content_key

#: One input file: (path, reader format of orchestrator.formats or "auto", JSONL key / parquet column).
File = tuple[str, str, str]


@dataclasses.dataclass(frozen=True)
class ScoringSettings:
    sample_tokens: int = field(100_000, help="tokens per sub-sample of each source (10M in the seed)")
    num_samples: int = field(5, help="sub-samples per source; each measure is their mean (5 in the seed)")
    order: int = field(3, help="n-gram order of the KenLM model and of the JSD term distribution")
    seed: int = field(0, help="seed of the sub-sampling")
    short_source: Literal["error", "whole"] = field(
        "error", help="a source with fewer than sample_tokens tokens: 'error' stops naming the file; "
                      "'whole' scores the whole source in every sub-sample (logged, recorded in the scores)")
    lmplz_memory: str = field("1G", help="lmplz -S: memory for n-gram counting (e.g. 1G, 20%)")

    def __post_init__(self) -> None:
        if self.sample_tokens < 1:
            raise ConfigError(f"sample_tokens must be >= 1, got {self.sample_tokens}")
        if self.num_samples < 1:
            raise ConfigError(f"num_samples must be >= 1, got {self.num_samples}")
        if not 2 <= self.order <= 6:  # KenLM's build_binary takes no unigram model
            raise ConfigError(f"order must be in 2..6, got {self.order}")
        if self.seed < 0:  # numpy's generators take no negative seed
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        size = re.fullmatch(r"(\d+(?:\.\d+)?)([%bKMGTPEZY]?)", self.lmplz_memory.strip())
        if not size:
            raise ConfigError(f"lmplz_memory is {self.lmplz_memory!r}: lmplz -S takes a size such as 500M, 2G or "
                              "a share of the memory such as 20%")
        number, unit = float(size.group(1)), size.group(2)
        if unit == "%" and not 0 < number <= 100:
            raise ConfigError(f"lmplz_memory is {self.lmplz_memory!r}: a share of the memory is in (0, 100]%")
        # lmplz's vocabulary hash alone takes 24M (its default vocab_estimate); a bare number is in K, as lmplz reads it
        if unit != "%" and number * 1024 ** " bKMGTPEZY".index(unit or "K") / 1024 < 32 * 1024 ** 2:
            raise ConfigError(f"lmplz_memory is {self.lmplz_memory!r}: lmplz needs at least 32M (its vocabulary "
                              "hash alone takes 24M)")

    def scoring(self) -> dict:
        """The settings alone, as keyword arguments (a subclass's own fields left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ScoringSettings)}


def scoring_key(settings: ScoringSettings, sources: Sequence[File] | Mapping[str, Sequence[File]],
                targets: Mapping[str, Sequence[File]]) -> str:
    """What scores depend on: the settings, the source files (one source's list, or {name: files})
    and the target files ({task: files}), by path, reader and content."""
    named = sources if isinstance(sources, Mapping) else {"": sources}
    source_paths = [f[0] for files in named.values() for f in files]
    listed = ({name: [list(f) for f in files] for name, files in sources.items()} if isinstance(sources, Mapping)
              else [list(f) for f in sources])
    return content_key("selection", settings.scoring(), listed, hash_inputs(source_paths),
                       {task: [list(f) for f in files] for task, files in sorted(targets.items())},
                       hash_inputs(f[0] for files in targets.values() for f in files))
