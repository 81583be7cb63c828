"""What every job shares: --help, --config, --preset, dotted overrides, --dry-run.

A job script is only this:

    def main(argv=None):
        return run_job(JobSpec(name=..., config_cls=..., run=run, dry_run=plan, presets=...), argv)

``run(cfg) -> result`` and ``plan(cfg) -> str`` are importable functions; nothing runs at import.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.core.config import describe, load_config, public, read_yaml, redacted, to_dict
from orchestrator.core.console import LOG_LINE, LOG_TIME, end_trail, keep_closing_lines, redact_log_records, set_verbose
from orchestrator.core.errors import (
    OrchestratorError,
    Terminated,
    raise_on_sigterm,
    raised_by_environment,
    raised_by_user_input,
    sigterm_seen,
)
from orchestrator.core.manifest import check_writable_dir, nearest_existing
from orchestrator.core.registry import suggest

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"



def shorthand_overrides(argv: Sequence[str], named: Sequence[tuple[str, str, str]] = (),
                        lists: Sequence[tuple[str, str]] = (), per_name: bool = False) -> list[str]:
    """A job's flag shorthands turned into config overrides; the rest of ``argv`` is kept.

    ``lists``: ``(flag, key)``, ``--flag A B ...`` (repeatable) -> ``key=["A", "B", ...]``.
    ``named``: ``(flag, key, form)``, ``--flag NAME=VALUE`` (repeatable) -> ``key={"NAME": "VALUE", ...}``,
    or with ``per_name`` one ``key.NAME="VALUE"`` each (merged into the preset's entries; a NAME with a dot
    is refused). A malformed item exits naming the flag and ``form``. The overrides go next to the user's
    own (argparse takes the positional overrides as one run)."""
    def dest(flag: str) -> str:
        return flag.lstrip("-").replace("-", "_")

    pre = argparse.ArgumentParser(add_help=False)
    for flag, _ in lists:
        pre.add_argument(flag, nargs="+", action="extend", default=[])
    for flag, _, _ in named:
        pre.add_argument(flag, action="append", default=[])
    known, rest = pre.parse_known_args(list(argv))
    overrides = [f"{key}=" + json.dumps(values) for flag, key in lists if (values := getattr(known, dest(flag)))]
    for flag, key, form in named:
        pairs = {}
        for item in getattr(known, dest(flag)):
            name, sep, value = item.partition("=")
            if not sep or not name or not value or (per_name and "." in name):
                raise SystemExit(f"error: {flag} {item!r} is not {form}")
            pairs[name] = value
        if per_name:
            overrides += [f"{key}.{name}={json.dumps(value)}" for name, value in pairs.items()]
        elif pairs:
            overrides.append(f"{key}=" + json.dumps(pairs))
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:at] + overrides + rest[at:]

#: What a re-run goes on from, said when a job is stopped: the stages that finished, pretraining's checkpoints and the
#: sweep's trials; a stage cut short starts over (a corpus read stopped at 336 of 1,521 MB began again at 0: probe G2)
RESUMES = ("finished stages, pretraining checkpoints and sweep trials; a corpus, vocabulary or instances stage "
           "cut short starts over")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    name: str
    description: str
    config_cls: type
    run: Callable[[Any], Any]
    dry_run: Callable[[Any], str]
    default_preset: str | None = None
    # Top-level preset keys a --config file does not inherit (e.g. blue_sweep's `arms`: the default
    # preset's experiment must not turn every --config run into that experiment).
    preset_only: tuple[str, ...] = ()
    # Config keys (dotted) naming the directories the job writes: each, when set, must be or become a
    # directory this user can write in, checked before the run and by --dry-run (before Ray starts).
    outputs: tuple[str, ...] = ()


def preset_names(job: str) -> list[str]:
    """The presets of one job: ``orchestrator/presets/<job>/<name>.yaml``."""
    return sorted(p.stem for p in (PRESET_DIR / job).glob("*.yaml"))


def load_preset(job: str, name: str) -> dict:
    path = PRESET_DIR / job / f"{name}.yaml"
    if not path.is_file():
        names = preset_names(job)
        raise OrchestratorError(f"unknown preset {name!r} for jobs/{job}.py"
                                + (suggest(name, names) if names else " (this job has no presets)"))
    return read_yaml(path)


def build_parser(spec: JobSpec) -> argparse.ArgumentParser:
    values, shown = None, "defaults"
    if spec.default_preset:  # show what a plain run uses: the default preset applied
        try:
            values = to_dict(load_config(spec.config_cls, base=load_preset(spec.name, spec.default_preset)))
            shown = f"the values a plain run uses, preset {spec.default_preset!r} applied"
        except OrchestratorError:
            values = None
    epilog = (f"config keys (set in --config YAML or as dotted overrides key.path=value; shown with {shown}):\n"
              + "\n".join(describe(spec.config_cls, values=values)))
    p = argparse.ArgumentParser(prog=f"python jobs/{spec.name}.py", description=spec.description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    kept = (f"; the preset's {' and '.join(spec.preset_only)} are not taken: the file's own, if any"
            if spec.preset_only else "")
    p.add_argument("--config", type=Path, help="YAML config file, applied over the preset: a key it does not set "
                                                f"keeps the preset's value (--preset none: the defaults){kept}")
    names = preset_names(spec.name)
    p.add_argument("--preset", default=spec.default_preset,
                   help=f"named preset under orchestrator/presets/{spec.name} ({', '.join(names) or 'none'}); "
                        f"default: {spec.default_preset}")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the config and that every input exists and parses, print the plan, train nothing")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="the full output on the terminal: Ray's, Tune's and the workers' own lines and debug "
                        "logging (by default blue_sweep, entity_cycle, pretrain and retrieval keep them in their "
                        "run's log file, <run directory>/logs/job.log, and augment in logs/job.log beside its "
                        "output; the terminal shows the stages, progress, warnings and the summary; the other jobs "
                        "print them)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="dotted config overrides")
    return p


def resolve_config(spec: JobSpec, args: argparse.Namespace):
    base = load_preset(spec.name, args.preset) if args.preset and args.preset != "none" else {}
    if args.config is not None:
        own = read_yaml(args.config) if any(k in base for k in spec.preset_only) and args.config.is_file() else {}
        if dropped := [k for k in spec.preset_only if k in base and k not in (own or {})]:  # said, not silent
            logging.getLogger(spec.name).info(
                "--config %s: no %s from preset %r (a file's %s are its own); the preset's other keys apply where "
                "the file does not set them (--preset none: the defaults)", args.config, " or ".join(dropped),
                args.preset, " and ".join(spec.preset_only))
        base = {k: v for k, v in base.items() if k not in spec.preset_only}
    return load_config(spec.config_cls, args.config, args.overrides, base=base)


def run_job(spec: JobSpec, argv: list[str] | None = None) -> int:
    args = build_parser(spec).parse_args(argv)
    set_verbose(args.verbose)
    redact_log_records()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format=LOG_LINE, datefmt=LOG_TIME)
    raise_on_sigterm()
    cfg, closing = None, []  # the lines said after the run's log file is let go: copied to it (end_trail)
    keep_closing_lines()

    def say(text: str, *, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout)
        closing.append(text)

    try:
        cfg = resolve_config(spec, args)
        if args.print_config:
            print(yaml.safe_dump(public(to_dict(cfg)), sort_keys=False))
            return 0
        logging.getLogger(spec.name).debug("resolved config:\n%s", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        check_outputs(spec, cfg)
        if args.dry_run:
            print(redacted(spec.dry_run(cfg)))
            print("dry run: config and inputs are valid; nothing was trained.")
            return 0
        start = time.monotonic()
        result = spec.run(cfg)
        logging.getLogger(spec.name).info("finished in %.1f s", time.monotonic() - start)
        if result is not None and hasattr(result, "summary"):
            say(redacted(result.summary()))
        return getattr(result, "exit_code", 0)
    except BrokenPipeError:  # the reader went first (`--dry-run | head`): what a tool killed by SIGPIPE returns
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's last flush goes nowhere
        return 128 + signal.SIGPIPE
    except Exception as exc:
        user_error = raised_by_user_input(exc)
        if user_error is not None:
            say(redacted(f"error: {user_error}"), err=True)
            return 2
        lacking = raised_by_environment(exc)
        if lacking is not None:  # a full disk, a limit, a permission: the machine's, not a bug
            code, short = lacking
            if code in (errno.ENOSPC, errno.EDQUOT) and cfg is not None:
                short += free_space(spec, cfg)
            say(redacted(f"error: {short}; re-run the same command once it is fixed: finished work is kept"), err=True)
            return 1
        # a bug, not bad input: one line here, the traceback in a file
        path = _keep_traceback(spec.name)
        say(redacted(f"error: unexpected {type(exc).__name__}: {exc}\n       (a bug: the traceback is in {path})"),
            err=True)
        return 1
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, SIGTERM (Terminated), or a library's handler of
        # either ending the run with sys.exit (Ray Train's on Ctrl-C; Ray's on SIGTERM, with status 15)
        term = isinstance(exc, Terminated) or sigterm_seen() or (isinstance(exc, SystemExit) and exc.code == 15)
        say(f"{'terminated (SIGTERM)' if term else 'interrupted'}: finished work is kept; re-run the same command "
            f"to resume ({RESUMES})", err=True)
        return 143 if term else 130
    finally:
        end_trail("\n".join(closing))


def free_space(spec: JobSpec, cfg: Any) -> str:
    """``" (free: out_dir /x 0.00 GB, TMPDIR /tmp 3.10 GB)"``: the free space where the job writes (its outputs,
    and the temp directory pretraining stages each checkpoint in)."""
    places = [(key, value) for key in spec.outputs if (value := _setting(cfg, key))]
    places.append(("TMPDIR", tempfile.gettempdir()))
    said = []
    for name, place in places:
        with contextlib.suppress(OSError):
            said.append(f"{name} {place} {shutil.disk_usage(nearest_existing(place)).free / 1e9:.2f} GB")
    return f" (free: {', '.join(said)})" if said else ""


def _setting(cfg: Any, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def check_outputs(spec: JobSpec, cfg: Any) -> None:
    """Every output directory the job names (``spec.outputs``) is, or can become, a writable directory."""
    for key in spec.outputs:
        value = _setting(cfg, key)
        if value:
            check_writable_dir(value, key)


def _keep_traceback(job: str) -> Path:
    """The current exception's traceback in a new file of the temp directory; returns its path.
    ``mkstemp``: a name no one can guess, created 0600 and never through a link planted there."""
    fd, name = tempfile.mkstemp(prefix=f"bioptorch-{job}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-",
                                suffix=".txt")
    with open(fd, "w", encoding="utf-8") as f:
        f.write(redacted(traceback.format_exc()))
    return Path(name)
