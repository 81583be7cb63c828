"""Every job is a thin entry script with --help, --dry-run and a tiny preset that validates."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT, run_job

JOBS = sorted(p.name for p in (ROOT / "jobs").glob("*.py"))


def test_all_expected_jobs_exist():
    assert {"blue_sweep.py", "build_corpus.py", "pretrain.py", "score_sources.py", "report.py",
            "augment.py"} <= set(JOBS)


@pytest.mark.parametrize("job", JOBS)
def test_job_has_help_with_dry_run(job):
    res = run_job(job, "--help", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--dry-run" in res.stdout and "--config" in res.stdout


@pytest.mark.parametrize("job", JOBS)
def test_job_does_no_work_at_import(job):
    """Entry scripts only parse and call run(cfg): nothing but defs, imports and the main guard."""
    tree = ast.parse((ROOT / "jobs" / job).read_text())
    for node in tree.body:
        allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
        is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_main_guard = isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        assert isinstance(node, allowed) or is_doc or is_main_guard, f"{job}: top-level {ast.unparse(node)[:80]}"


#: the dry run of each job's preset on a fresh clone: its default one, and the tiny one of retrieval and
#: score_sources (none is their default: it would sit under a user's own models or sources). Left out: augment's
#: and pretrain's presets read the outputs of jobs/pretrain.py and jobs/build_corpus.py; report.py has no preset.
PRESET_DRY_RUNS = {"blue_sweep.py": [], "build_corpus.py": [], "entity_cycle.py": [], "propose_mix.py": [],
                   "proxy_search.py": [], "tokenizer_quality.py": [], "retrieval.py": ["--preset", "tiny"],
                   "score_sources.py": ["--preset", "tiny"]}


def test_every_job_but_three_has_its_preset_dry_run_here():
    assert set(JOBS) - set(PRESET_DRY_RUNS) == {"augment.py", "pretrain.py", "report.py"}


@pytest.mark.parametrize("job", sorted(PRESET_DRY_RUNS))
def test_default_preset_dry_run_passes(job, tmp_path):
    res = run_job(job, *PRESET_DRY_RUNS[job], "--dry-run", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dry run" in res.stdout


@pytest.mark.parametrize("job", [j for j in JOBS if j != "report.py"])  # the report's input is a run's output
def test_every_job_has_a_small_cpu_preset(job):
    from orchestrator.core.cli import preset_names

    assert {"tiny", "default", "smoke"} & set(preset_names(job.removesuffix(".py"))), job


@pytest.mark.parametrize("job", JOBS)
def test_every_preset_of_every_job_prints_its_config(job, capsys):
    """``--print-config`` shows a preset even when it leaves inputs to the user: `pretrain --preset seed000
    --print-config` exited 2 asking for instances_dir (probe G), and `report --print-config` asking for
    --run-dir (docs probe D7); a run and a dry run still ask for them."""
    import importlib.util

    import yaml

    from orchestrator.core.cli import preset_names, run_job

    spec = importlib.util.spec_from_file_location(f"job_{job[:-3]}", ROOT / "jobs" / job)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for preset in [None, *preset_names(job.removesuffix(".py"))]:  # None: the job's default, with no --preset
        argv = ["--print-config"] if preset is None else ["--preset", preset, "--print-config"]
        assert module.main(argv) == 0, (preset, capsys.readouterr().err)
        assert isinstance(yaml.safe_load(capsys.readouterr().out), dict), preset
    if job == "pretrain.py":
        assert run_job(module.SPEC, ["--preset", "seed000", "--dry-run"]) == 2
        assert "instances_dir and tokenizer_dir are required" in capsys.readouterr().err
    if job == "report.py":
        assert run_job(module.SPEC, ["--dry-run"]) == 2
        assert "give run_dir (--run-dir)" in capsys.readouterr().err


def test_the_scoring_jobs_tiny_preset_reads_the_bundled_sample():
    res = run_job("score_sources.py", "--preset", "tiny", "--dry-run", timeout=300)
    assert res.returncode == 0 and "source in_domain: 1 file(s)" in res.stdout, res.stderr[-2000:]


def test_presets_belong_to_their_job():
    """`blue_sweep --preset tiny` used to load the augment job's preset and fail on its keys; each job now
    offers its own presets only, and an unknown one is named with the job's choices."""
    res = run_job("blue_sweep.py", "--preset", "tiny", "--dry-run", timeout=300)
    assert res.returncode == 2
    assert "unknown preset 'tiny' for jobs/blue_sweep.py" in res.stderr and "default" in res.stderr
    help_text = run_job("pretrain.py", "--help", timeout=300).stdout
    assert "orchestrator/presets/pretrain" in help_text and "seed000" in help_text and "smoke" not in help_text



def test_an_unexpected_error_is_one_line_and_a_traceback_file(capsys, tmp_path, monkeypatch):
    """A bug inside a job: one line on stderr naming the file that holds the traceback, exit 1."""
    import re
    import tempfile
    from dataclasses import dataclass

    from orchestrator.core.cli import JobSpec, run_job

    @dataclass(frozen=True)
    class Empty:
        pass

    def broken(cfg):
        raise ZeroDivisionError("division by zero deep inside")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the suite leaves no traceback file in /tmp
    code = run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=broken, dry_run=str), [])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 2 and "unexpected ZeroDivisionError: division by zero deep inside" in err
    path = Path(re.search(r"traceback is in (\S+)\)", err).group(1))
    assert path.parent == tmp_path and "in broken" in path.read_text() and "ZeroDivisionError" in path.read_text()


def test_bad_input_found_in_a_ray_task_is_one_line_and_exit_2(capsys, ray_local):
    """A reader in a Ray task raises InputError; the driver gets Ray's wrapper, whose text is the remote
    traceback: the job prints the original's one line and exits 2, as for bad input found locally."""
    from dataclasses import dataclass

    import ray

    from orchestrator.core.cli import JobSpec, run_job
    from orchestrator.core.errors import ConfigError, InputError

    @dataclass(frozen=True)
    class Empty:
        pass

    @ray.remote
    def read_vectors():
        raise InputError("vectors.vec", "no vectors", line=1, expected="a header 'count dim'")

    def run(cfg):
        try:
            ray.get(read_vectors.remote())
        except Exception as exc:
            raise RuntimeError("the stage failed") from exc  # a further wrapper, as a stage may add

    code = run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=run, dry_run=str), [])
    err = capsys.readouterr().err
    assert (code, err) == (2, "error: vectors.vec:1: no vectors (expected a header 'count dim')\n")

    def refuse(cfg):  # an error raised from another keeps its own text
        try:
            raise InputError("a.tsv", "bad row", line=3)
        except InputError as exc:
            raise ConfigError("sweep.task_dirs: a task's files are unreadable") from exc

    code = run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=refuse, dry_run=str), [])
    assert (code, capsys.readouterr().err) == (2, "error: sweep.task_dirs: a task's files are unreadable\n")


def test_a_full_disk_or_a_limit_is_said_as_such_not_as_a_bug(capsys, ray_local):
    """A probe (session 44): a full disk, a quota, a read-only file system or the open-file limit, met locally,
    in a library's words or inside a Ray task, printed "unexpected OSError ... (a bug)", mostly without the
    file, and as a remote traceback of 25 lines from a Ray task. Now one line saying what the machine lacks."""
    import errno
    import re
    from dataclasses import dataclass

    import ray

    from orchestrator.core.cli import JobSpec, run_job

    @dataclass(frozen=True)
    class Empty:
        pass

    @ray.remote
    def write_instances():
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/instances/len128/part-3.parquet")

    def remote(cfg):
        ray.get(write_instances.remote())

    def arrow(cfg):  # pyarrow's and tokenizers' errors carry no errno
        raise Exception("Error writing bytes to file. Detail: [errno 28] No space left on device")

    def read_only(cfg):
        raise OSError(errno.EROFS, "Read-only file system", "/runs/x/vocab")

    free = r" \(free: TMPDIR \S+ \d+\.\d\d GB\)"  # and, for a full disk, the free space where the job writes
    for run, said in [(remote, re.escape("no space left on the disk: /runs/x/instances/len128/part-3.parquet") + free),
                      (arrow, re.escape("no space left on the disk: Error writing bytes to file. Detail: [errno 28] "
                                        "No space left on device") + free),
                      (read_only, re.escape("the file system is read-only: /runs/x/vocab"))]:
        code = run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=run, dry_run=str), [])
        err = capsys.readouterr().err
        assert code == 1 and re.fullmatch(f"error: {said}; re-run the same command once it is fixed: finished work "
                                          "is kept\n", err), err


def test_a_ray_train_workers_own_error_is_found_under_the_runs_failure():
    """Ray Train reports a worker's exception inside ``WorkerGroupError.worker_failures``: the job prints that
    worker's one line (a checkpoint that will not fit in TMPDIR, a full disk), not "pretraining failed:" and
    the worker's traceback (the resource probe, session 44)."""
    import errno

    from ray.train import WorkerGroupError

    from orchestrator.core.errors import ConfigError, raised_by_environment, raised_by_user_input, worker_failure

    said = ConfigError("a checkpoint of this run needs about 2.4 MB in the temp directory /t")
    failed = WorkerGroupError("rank 0: ...traceback...", {0: said, 1: RuntimeError("the other rank's barrier")})
    assert raised_by_user_input(RuntimeError("wrapped")) is None
    assert raised_by_user_input(failed) is said
    full = WorkerGroupError("rank 0", {0: OSError(errno.ENOSPC, "No space left on device", "/runs/ckpt")})
    assert raised_by_user_input(full) is None
    assert raised_by_environment(full) == (errno.ENOSPC, "no space left on the disk: /runs/ckpt")
    # what pretraining raises for each: the worker's line, the run's failure (the job names the disk), a wrapper
    assert worker_failure(failed, "pretraining") is said and worker_failure(full, "pretraining") is full
    assert str(worker_failure(RuntimeError("it broke"), "pretraining")) == "pretraining failed: it broke"
    # HOME=/dev/null: Ray's token set-up inside ray.init failed on ~/.ray, "unexpected NotADirectoryError (a bug)"
    # (an environment probe, session 46)
    home = NotADirectoryError(errno.ENOTDIR, "Not a directory", "/dev/null/.ray")
    assert raised_by_environment(home) == (errno.ENOTDIR, "not a directory (a part of the path is a file; HOME or "
                                                          "TMPDIR?): /dev/null/.ray")


def test_help_shows_the_values_a_plain_run_uses():
    """--help shows the default preset applied (issue 19), not the dataclass defaults."""
    text = run_job("blue_sweep.py", "--help", timeout=300).stdout
    assert "preset 'default' applied" in text
    assert "sweep.search_space = 'tiny'" in text  # the dataclass default is 'blue'
    assert "pretrain.phase1.steps = 1200" in text
    assert "corpus.sources = ()" not in text and "in_domain" in text


def test_a_config_file_does_not_inherit_the_presets_experiment(tmp_path, monkeypatch):
    """Keys named in `preset_only` (blue_sweep: arms, baseline) come from the preset only when no
    --config is given: the default's experiment must not turn configs/real_data.yaml into one."""
    from dataclasses import dataclass, field

    from orchestrator.core import cli

    @dataclass(frozen=True)
    class Cfg:
        name: str = "x"
        arms: dict = field(default_factory=dict)

    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "default.yaml").write_text("name: from-preset\narms: {a: {}, b: {name: y}}\n")
    (tmp_path / "own.yaml").write_text("name: from-file\n")
    monkeypatch.setattr(cli, "PRESET_DIR", tmp_path)
    seen = []
    spec = cli.JobSpec(name="demo", description="demo", config_cls=Cfg, run=seen.append, dry_run=str,
                       default_preset="default", preset_only=("arms",))
    assert cli.run_job(spec, []) == 0 and cli.run_job(spec, ["--config", str(tmp_path / "own.yaml")]) == 0
    assert seen[0] == Cfg(name="from-preset", arms={"a": {}, "b": {"name": "y"}})
    assert seen[1] == Cfg(name="from-file", arms={})


def test_the_traceback_file_never_follows_a_link_planted_at_its_name(tmp_path, monkeypatch):
    """The traceback file's name cannot be guessed and it is created 0600, never through a symlink
    planted in the temp directory (issue 34 item 6: it wrote through one at its predictable name)."""
    import os
    import stat
    import tempfile
    import time

    from orchestrator.core.cli import _keep_traceback

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    now = time.time()
    for t in (now, now + 1, now + 2):  # the names the job would use within the next seconds
        (tmp_path / f"bioptorch-demo-{time.strftime('%Y%m%d-%H%M%S', time.localtime(t))}-{os.getpid()}.txt"
         ).symlink_to(victim)
    try:
        raise ZeroDivisionError("deep inside")
    except ZeroDivisionError:
        path = _keep_traceback("demo")
    assert victim.read_text() == "keep me"
    assert path.parent == tmp_path and not path.is_symlink() and "ZeroDivisionError" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_job_stopped_by_sigterm_says_so_cleans_up_and_exits_143(tmp_path):
    """Probe: a sweep stopped by SIGTERM exited 1 without a word (Ray's own handler), and a scoring stopped by
    it left its temporary copy of the source (as large as the source) for good. SIGTERM now raises in the main
    thread, so `with` blocks clean up, and the job says what happened."""
    import signal
    import subprocess
    import sys
    import time

    source = tmp_path / "source.txt"
    lines = (ROOT / "orchestrator" / "sample_data" / "corpus" / "general.txt").read_text(encoding="utf-8").splitlines()
    source.write_text("\n".join(lines * 20) + "\n", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    args = [sys.executable, str(ROOT / "jobs" / "score_sources.py"), f"out_dir={tmp_path / 'out'}", f"work_dir={work}",
            "parallel=false", "sample_tokens=20000", "num_samples=50", "lmplz_memory=50M",
            "--source", f"big={source}", "--target", str(ROOT / "orchestrator" / "sample_data" / "blue" / "HoC" /
                                                            "train.tsv")]
    job = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(work.glob(".score-big.tmp-*")) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(work.glob(".score-big.tmp-*")), "the scoring never made its working copy"
    time.sleep(1.0)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 143, err[-2000:]
    assert "terminated (SIGTERM): finished work is kept; re-run the same command to resume (finished stages" in err
    assert not list(work.iterdir())  # the working copy went with the scoring
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("stop, code, said", [(KeyboardInterrupt(), 130, "interrupted"),
                                              (SystemExit(0), 130, "interrupted"),
                                              (SystemExit(15), 143, "terminated (SIGTERM)")])
def test_a_library_ending_the_run_with_sys_exit_is_reported_as_the_stop_it_was(capsys, stop, code, said):
    """Probe: Ctrl-C during pretraining exited 1 without a word: Ray Train's SIGINT handler ends the run with
    sys.exit(0), and Ray's SIGTERM handler with sys.exit(15), neither of which run_job caught."""
    from dataclasses import dataclass

    from orchestrator.core.cli import RESUMES, JobSpec, run_job

    @dataclass(frozen=True)
    class Empty:
        pass

    def stopped(cfg):
        raise stop

    assert run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=stopped, dry_run=str), []) == code
    whole = f"{said}: finished work is kept; re-run the same command to resume ({RESUMES})\n"
    assert capsys.readouterr().err == whole


def test_after_ray_stops_sigterm_still_raises_and_ctrl_c_is_not_ray_tunes(tmp_path):
    """Probe C items 2 and 4: once a job's Ray session ended, a SIGTERM killed it outright (status -15, no message,
    no clean-up: ray.shutdown resets the handling below Python); and Ctrl-C in a sweep was caught by Ray Tune,
    which ended the run as if finished, so the job called the unfinished trials bad input (exit 2)."""
    import os
    import subprocess
    import sys

    code = """
import os, signal, time
from orchestrator.core.errors import Terminated, raise_on_sigterm
from orchestrator.core.runtime import ray_session
raise_on_sigterm()
with ray_session(num_cpus=1):
    from ray.tune.tune import _setup_signal_catching
    before = signal.getsignal(signal.SIGINT)  # Python's, or SIG_IGN under nohup and background jobs
    _setup_signal_catching()
    print("tune's handler:", signal.getsignal(signal.SIGINT) is not before, flush=True)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except Terminated:
    print("raised after the session", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["tune's handler: False", "raised after the session"], out.stdout


def test_weights_that_would_run_code_are_refused_as_bad_input_naming_the_file(tmp_path):
    """A security probe (session 45): a pytorch_model.bin or a checkpoint's training state whose pickle would
    run a command was refused by torch's weights_only load, but the job called the UnpicklingError a bug and
    passed on torch's advice to load with weights_only=False. It is bad input now, naming the file."""
    import os
    import pickle

    import pytest
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from orchestrator.core.errors import InputError
    from orchestrator.modeling.encoder import from_pretrained, load_encoder
    from orchestrator.pretrain.checkpoint import STATE_FILE, load_training_state

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    model = tmp_path / "model"
    BertForMaskedLM(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=16)).save_pretrained(model)
    (model / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": Payload()}, model / "pytorch_model.bin")
    for load in (lambda: from_pretrained(BertForMaskedLM, model), lambda: load_encoder(model)):
        with pytest.raises(InputError, match="objects other than tensors") as caught:
            load()
        assert str(model) in str(caught.value) and "weights_only=False" not in str(caught.value)
    (tmp_path / "ckpt").mkdir()
    with open(tmp_path / "ckpt" / STATE_FILE, "wb") as f:
        pickle.dump({"step": Payload()}, f)
    with pytest.raises(InputError, match=f"{STATE_FILE}: it holds objects other than tensors"):
        load_training_state(tmp_path / "ckpt")
    assert not (tmp_path / "ran").exists()


def test_output_piped_to_a_reader_that_stops_early_is_no_bug(tmp_path):
    """A probe (session 45): `jobs/blue_sweep.py --dry-run | head -1` ended as "unexpected BrokenPipeError (a
    bug)" with a traceback file. It ends as a tool killed by SIGPIPE does (141), quietly."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from conftest import ROOT

    before = set(Path(tempfile.gettempdir()).glob("bioptorch-blue_sweep-*"))
    proc = subprocess.Popen([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), "--dry-run",
                             f"runs_root={tmp_path}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    proc.stdout.close()  # the reader is gone before the job prints
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 128 + signal.SIGPIPE, err
    assert "unexpected" not in err and "Traceback" not in err
    assert set(Path(tempfile.gettempdir()).glob("bioptorch-blue_sweep-*")) == before  # no traceback file


def test_every_job_runs_with_docstrings_stripped():
    """An environment probe (session 46): under ``python -OO`` (docstrings stripped) every job but two crashed at
    import with "'NoneType' object has no attribute 'split'", --help included."""
    import subprocess
    import sys

    script = ("import contextlib, io, runpy, sys\n"
              "for path in sys.argv[1:]:\n"
              "    main = runpy.run_path(path)['main']\n"
              "    with contextlib.redirect_stdout(io.StringIO()):\n"
              "        try:\n"
              "            main(['--help'])\n"
              "        except SystemExit as stop:\n"
              "            assert stop.code == 0, (path, stop.code)\n"
              "print('OK', len(sys.argv) - 1)\n")
    res = subprocess.run([sys.executable, "-OO", "-c", script, *[str(ROOT / "jobs" / j) for j in JOBS]],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip() == f"OK {len(JOBS)}", res.stderr[-3000:]


def test_a_config_file_without_arms_says_it_runs_no_preset_arms(tmp_path):
    """Docs probe D2: a one-key --config file turned the main job's pretrained-vs-floor experiment into one
    chain without a word (the preset's arms and baseline are not a file's); --help and the run now say so."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"run_name: x\nruns_root: {tmp_path / 'runs'}\n")
    res = run_job("blue_sweep.py", "--config", str(plain), "--dry-run", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"--config {plain}: no arms or baseline from preset 'default'" in res.stderr
    assert "stages: corpus -> vocab" in res.stdout  # one chain, as said
    own = tmp_path / "own.yaml"
    own.write_text(f"runs_root: {tmp_path / 'runs'}\narms: {{a: {{}}, b: {{init: random}}}}\nbaseline: a\n")
    res = run_job("blue_sweep.py", "--config", str(own), "--dry-run", timeout=300)
    assert res.returncode == 0 and "preset 'default'" not in res.stderr, res.stderr[-2000:]
    assert "the preset's arms and baseline are not taken" in " ".join(run_job("blue_sweep.py", "--help").stdout.split())


@pytest.mark.parametrize("fails", [False, True], ids=["summary", "error"])
def test_the_run_log_holds_the_closing_lines_the_terminal_showed(tmp_path, capsys, caplog, fails):
    """Docs probe D13: logs/job.log ended at the report's line; the experiment page's line, "finished in", the
    summary (its cost table, the MLflow command) and a closing error reached the terminal only."""
    import logging
    from dataclasses import dataclass

    from orchestrator.core.cli import JobSpec, run_job
    from orchestrator.core.console import run_log
    from orchestrator.core.errors import InputError

    @dataclass(frozen=True)
    class Empty:
        pass

    @dataclass
    class Result:
        def summary(self) -> str:
            return "run directory : here\n  this run took 1 s"

    log_path = tmp_path / "logs" / "job.log"
    caplog.set_level(logging.INFO)  # as the job's own logging.basicConfig sets it

    def job(cfg):
        with run_log(log_path):
            logging.getLogger("demo").info("inside the run")
        logging.getLogger("dashboards.experiment_page").info("experiment page written: page.html")
        if fails:
            raise InputError(tmp_path / "x.tsv", "bad row", expected="3 columns")
        return Result()

    code = run_job(JobSpec(name="demo", description="demo", config_cls=Empty, run=job, dry_run=str), [])
    shown = capsys.readouterr()
    text = log_path.read_text()
    assert "INFO dashboards.experiment_page: experiment page written: page.html" in text
    if fails:
        assert code == 2 and "error: " in shown.err and f"error: {tmp_path / 'x.tsv'}: bad row" in text
    else:
        assert code == 0 and "demo: finished in" in text
        assert text.endswith("run directory : here\n  this run took 1 s\n")
    logging.getLogger("demo").info("after the job")  # the copying ended with the job
    assert "after the job" not in log_path.read_text()
