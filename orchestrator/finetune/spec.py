"""Tasks as data: one YAML per task, built on a family template through ``include:``.

    spec = load_task("biosses")           # orchestrator/finetune/tasks/biosses.yaml
    spec = load_task("hoc_prior")         # a variant there: include: hoc.yaml, one key changed
    spec = load_task("my_tasks/foo.yaml") # any YAML file following the same keys

Every shipped task YAML, its family templates (``_*.yaml``) and its variants live in one folder,
``orchestrator/finetune/tasks/``, which installs with the package; search spaces and configs name
them by file stem.

Python only says what YAML cannot (readers, heads, metrics); a new dataset in a known family
and file format needs a YAML file and no code.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Literal

from orchestrator.core.config import field, first_repeat, from_dict, merge, read_yaml
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.registry import suggest
from orchestrator.finetune.metrics import METRICS

TASK_DIR = Path(__file__).resolve().parent / "tasks"
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_data" / "blue"

Family = Literal["sts", "ner", "re", "multilabel", "nli", "doccls"]
#: A score group's name (a column of the report beside Total).
GROUP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
FileFormat = Literal["tsv", "blue_ner", "iob", "conll", "jsonl", "i2b2_deid"]


#: A split's file names in BLUE's releases and converters, tried (with the configured file's suffix) when the
#: configured one is absent
SPLIT_FILE_NAMES = {"train": ("train", "Training"), "dev": ("devel", "dev", "Development"), "test": ("test", "Test")}

@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str = field(help="display name, as in the BLUE tables (e.g. 'BC5CDR-chemical')")
    family: Family = field(help="sts | ner | re | multilabel | nli | doccls: picks the head, loss and reader")
    metric: str = field(help="metric name in orchestrator.finetune.metrics.METRICS")
    group: str = field(
        "other", help="score group: seed 000's clinical / biomedical, or any other name (e.g. 'japanese'); the "
                      "report averages each group's tasks in a column of its own beside Total")
    dir: str = field("", help="directory of this task's files under the sweep's data root")
    release_dir: str = field("", help="the task's folder in BLUE's bert_data release or as BLUE's scripts name it, "
                                      "where it differs from dir (hoc, ddi2013-type, BC5CDR/chem, mednli, "
                                      "ShAReCLEFEHealthCorpus): used when <data root>/<dir> does not exist")
    format: FileFormat = field("tsv", help="tsv (header by name) | blue_ner (4 columns) | iob | conll | jsonl | "
                                           "i2b2_deid (i2b2 2014 de-identification XML: a split is a directory "
                                           "of notes, one .xml file each)")
    files: dict[str, str] = field(default_factory=dict, help="split -> file name (train, dev, test; or all); "
                                                             "i2b2_deid: a directory name")
    columns: dict[str, str] = field(default_factory=dict,
                                    help="role (id, text_a, text_b, label) -> header column / JSON key")
    positions: dict[str, int] = field(default_factory=dict,
                                      help="role -> column index, used when a TSV has no header line (negative: "
                                           "from the end); such a file must have exactly the columns the "
                                           "positions name: max(positive)+1 plus max(|negative|)")
    quoting: Literal["csv", "none", "minimal"] = field(
        "csv", help="csv: a real CSV parser (quoted TABs); none: QUOTE_NONE, a quote is text; minimal: a quote is "
                    "text except in a cell a CSV writer quoted (wrapped in quotes, its inner quotes doubled, as "
                    "BLUE's converters write a cell holding one), which is unquoted. Token formats (ner) read a "
                    "token as written unless minimal, which unquotes such a token (BLUE's '\"' token, '\"\"\"\"')")
    labels: tuple[str, ...] = field((), help="the closed label set (order is significant for HoC's k_v cells)")
    score_range: tuple[float, float] | None = field(
        None, help="sts: the [low, high] every gold score must lie in (BIOSSES 0-4, MedSTS 0-5); null = any "
                   "finite number")
    negative_labels: tuple[str, ...] = field((), help="relation classes excluded from micro-F1 (false, DDI-false)")
    entity_type: str = field("", help="NER: entity type appended to bare B/I tags of BLUE's 4-column files")
    group_separator: str = field("", help="multilabel: document id = row id up to this separator")
    head_bias_init: Literal["zero", "prior"] = field(
        "zero", help="multilabel: 'zero' starts every sigmoid output at 0.5 (BERT / BLUE); 'prior' starts each "
                     "output's bias at the log-odds of its label's training frequency, so the first Adam steps do "
                     "not bend the encoder towards the label prior (the head's bias moves only ~lr per step); "
                     "needed when training is short (few hundred sentences, a few epochs). sts: 'prior' starts the "
                     "regression output at the mean training score instead of 0")
    restricted: bool = field(False, help="released only under a data-use agreement (MedNLI, i2b2, ShARe/CLEFE, "
                                          "MedSTS): every file derived from its text (tokenised splits, augmented "
                                          "splits, their word vectors) is written owner-only: folders 0700, files 0600")
    cv_folds: int = field(0, help="k >= 2: stratified k-fold cross-validation on the 'all' file (seed 000's "
                                  "DocClsJp); each fold is the test set once, dev is carved from the rest")
    resplit: dict[str, float] = field(default_factory=dict, help=(
        "split -> share of documents (train, dev, test; summing to 1): split the one file files.all by "
        "document (row id up to group_separator), for a corpus whose public release lacks some splits "
        "(ChemProt's dev file alone). The same split for every seed and run; no document crosses splits"))
    chunk_words: int = field(0, help="ner: cut every sentence (a whole note, for i2b2_deid) into pieces of at most "
                                     "this many words before tokenisation, each piece an example (seed 001: 250, "
                                     "so a note fits BERT's 512 tokens); 0 = as read. Without it, words past "
                                     "max_seq_length are predicted O")
    subword_labels: Literal["first", "all"] = field(
        "first", help="ner: which sub-words of a word are trained on its tag: 'first' (BERT's and seed 002's "
                      "recipe; the others are ignored by the loss) or 'all', every sub-word carrying its word's "
                      "IOB tag (seed 001). A word is predicted from its first sub-word either way")
    include: str = field("", help="family template this task was built on (resolved at load time)")

    def __post_init__(self):
        if not GROUP_NAME.fullmatch(self.group) or self.group in ("total", "partial"):
            raise ConfigError(f"task {self.name}: group {self.group!r} must be a lower-case name ([a-z0-9_-], not "
                              "'total' or 'partial'), e.g. clinical, biomedical, other")
        if not self.name.strip() or self.name.strip().lower() in ("total", "partial", self.group):
            raise ConfigError(f"task name {self.name!r}: give a name that is not empty and not a summary column of the "
                              f"report (total, partial, its group {self.group!r}; in any case)")
        METRICS.get(self.metric)
        if self.cv_folds or self.family == "doccls":
            if self.cv_folds < 2 or "all" not in self.files:
                raise ConfigError(f"task {self.name}: cross-validation needs cv_folds >= 2 and files.all")
            if self.family not in ("doccls", "re", "nli"):
                raise ConfigError(f"task {self.name}: cv_folds needs a single-label family (doccls, re, nli) "
                                  f"to stratify by, not {self.family}")
        elif self.resplit:
            if set(self.resplit) != {"train", "dev", "test"} or "all" not in self.files:
                raise ConfigError(f"task {self.name}: resplit needs files.all and shares for exactly train, dev "
                                  f"and test (got files {sorted(self.files)}, resplit {sorted(self.resplit)})")
            if min(self.resplit.values()) <= 0 or not math.isclose(sum(self.resplit.values()), 1.0):
                raise ConfigError(f"task {self.name}: resplit shares must be > 0 and sum to 1 "
                                  f"(got {dict(self.resplit)})")
        elif not {"train", "dev", "test"} <= set(self.files):
            raise ConfigError(f"task {self.name}: files must name train, dev and test (got {sorted(self.files)})")
        if self.family in ("re", "nli", "multilabel", "ner", "doccls") and not self.labels:
            raise ConfigError(f"task {self.name}: family {self.family} needs a closed label set (labels)")
        if (again := first_repeat(self.labels)) is not None:  # a label is an output of the head: one each
            raise ConfigError(f"task {self.name}: labels give {again!r} twice; list each label once")
        if self.head_bias_init == "prior" and self.family not in ("multilabel", "sts"):
            raise ConfigError(f"task {self.name}: head_bias_init 'prior' is defined for the multilabel family "
                              f"(sigmoid outputs) and sts (the mean score), not {self.family}")
        if self.score_range is not None:
            low, high = self.score_range
            if self.family != "sts":
                raise ConfigError(f"task {self.name}: score_range is for the sts family, not {self.family}")
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ConfigError(f"task {self.name}: score_range {list(self.score_range)} must be finite, low < high")
        if (self.chunk_words or self.subword_labels != "first" or self.format == "i2b2_deid") \
                and self.family != "ner":
            raise ConfigError(f"task {self.name}: chunk_words, subword_labels and the i2b2_deid format are for "
                              f"the ner family, not {self.family}")
        if self.chunk_words < 0:
            raise ConfigError(f"task {self.name}: chunk_words must be >= 0 (0 = no chunking), got {self.chunk_words}")
        unknown = [x for x in self.negative_labels if x not in self.labels]
        if unknown:
            raise ConfigError(f"task {self.name}: negative_labels {unknown} are not in labels")

    @property
    def file_splits(self) -> tuple[str, ...]:
        """The splits read from files: 'all' alone when the task is cross-validated or re-split."""
        return ("all",) if self.cv_folds or self.resplit else ("train", "dev", "test")

    @property
    def sentence_pairs(self) -> bool:
        """Whether an example has a second text (``text_b``), which a BERT tokenizer gives token type id 1."""
        return "text_b" in self.columns or "text_b" in self.positions

    @property
    def positive_labels(self) -> tuple[str, ...]:
        return tuple(x for x in self.labels if x not in self.negative_labels)

    def split_path(self, data_root: Path, split: str) -> Path:
        """The file of one split; where the configured name is absent, the other names BLUE's files have:
        its NER releases name the dev split 'devel', others 'dev', and its converter for the tasks it could not
        ship (ShARe/CLEFE, ``create_clefe_bert.py``) writes Training, Development and Test."""
        base = Path(data_root) / self.dir if self.dir else Path(data_root)
        path = base / self.files[split]
        if not path.exists():
            for alt in SPLIT_FILE_NAMES.get(split, ()):
                candidate = path.with_name(alt + path.suffix)
                if candidate.exists():
                    return candidate
        return path


def task_names() -> list[str]:
    """Names of the tasks shipped with the project (file stems, ``_`` templates excluded): BLUE's and
    JGLUE's tasks and their variants (a task YAML that includes another task, e.g. ``hoc_prior``)."""
    return sorted(p.stem for p in TASK_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def shipped_task_names() -> list[str]:
    """Every name a shipped task goes by: its file stem and its display name."""
    paths = [p for p in TASK_DIR.glob("*.yaml") if not p.stem.startswith("_")]
    return sorted({p.stem for p in paths} | {_display_name(p) for p in paths})


def is_task_path(name_or_path: str) -> bool:
    """Whether a task is named by its YAML's path rather than by a shipped task's name: a file stem or display
    name is a name, '/' or not ('ShARe/CLEFE'); anything else that ends .yaml/.yml or is a file is a path."""
    if name_or_path in shipped_task_names():
        return False
    return name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file()


def task_stem(name_or_path: str) -> str:
    """The file stem of the task YAML a stem, display name or path names ('BIOSSES' -> 'biosses')."""
    return _task_path(name_or_path).stem


def _is_variant(path: Path) -> bool:
    """A task built on another task (``include: hoc.yaml``), not on a family template (``_*.yaml``)."""
    parent = str(read_yaml(path).get("include") or "")
    return bool(parent) and not Path(parent).name.startswith("_")


def _task_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    by_stem = TASK_DIR / f"{name_or_path}.yaml"
    if by_stem.is_file():
        return by_stem
    by_name: dict[str, Path] = {}  # a display name a variant shares (hoc_prior: HoC) names the task it varies
    for p in sorted(TASK_DIR.glob("*.yaml"), key=lambda p: (_is_variant(p), p.stem)):
        if not p.stem.startswith("_"):
            by_name.setdefault(_display_name(p), p)
    if name_or_path in by_name:
        return by_name[name_or_path]
    if path.suffix in (".yaml", ".yml"):  # a task file named, not a task's name
        raise InputError(path, "task file not found", expected="a task YAML (docs/CONTRIBUTING.md) or a shipped "
                                                               "task's name")
    raise ConfigError(f"unknown task {name_or_path!r}{suggest(name_or_path, shipped_task_names())}")


def _display_name(path: Path) -> str:
    return str(read_yaml(path).get("name", path.stem))


def _resolve_includes(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: include cycle through {[str(p) for p in seen]}")
    data = read_yaml(path)
    parent = data.get("include")
    if not parent:
        return data
    if not isinstance(parent, str) or Path(parent).suffix not in (".yaml", ".yml"):
        raise ConfigError(f"{path}: include {str(parent)[:80]!r} is not a task YAML (expected a .yaml file)")
    parent_path = (path.parent / parent).resolve()
    if not parent_path.is_file():  # a user's task may build on a shipped task or template
        parent_path = TASK_DIR / parent
    if not parent_path.is_file():
        templates = [p.name for p in TASK_DIR.glob("*.yaml")] + [p.name for p in path.parent.glob("*.yaml")]
        raise ConfigError(f"{path}: include {parent!r} found neither beside it nor in {TASK_DIR}"
                          f"{suggest(str(parent), templates)}")
    return merge(_resolve_includes(parent_path, seen + (path,)), data)


def load_task(name_or_path: str) -> TaskSpec:
    """A task by file stem ('bc5cdr_chemical'), display name ('BC5CDR-chemical') or YAML path."""
    path = _task_path(name_or_path)
    data = _resolve_includes(path)
    try:
        return from_dict(TaskSpec, data, where=str(path))
    except ConfigError as exc:  # TaskSpec's own checks name the task; its file is named here
        if str(path) in str(exc):
            raise
        raise ConfigError(f"{path}: {exc}") from None
