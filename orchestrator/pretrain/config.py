"""Typed configuration of the pretraining stage: model, two length phases, optimiser, precision, scaling.

One config runs on a laptop (2 CPU workers, gloo) and on a GPU cluster (``use_gpu: true``, NCCL):
only ``num_workers`` / ``use_gpu`` / ``accelerator_type`` / ``resources_per_worker`` change. Phase 1
is the 128-token phase, phase 2 the 512-token phase of NVIDIA's recipe (seed 000); ``phase2.steps: 0``
skips it. A phase runs its ``steps`` unless a stopping rule (``stop``: a plateau of the MLM loss, an
MLM accuracy) ends it earlier.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.core.config import check_number, field, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import file_sha256, read_json_object, read_manifest
from orchestrator.core.reuse import KEY_FIELD, content_key, model_identity, output_key, relocated_key
from orchestrator.pretrain.checkpoint import RUN_RECORD, run_in_progress

# hidden, layers, heads, intermediate. bert-tiny, mini and small are the miniature BERTs of Turc et
# al. 2019 ("Well-Read Students Learn Better"); tiny is half of bert-tiny, for tests.
SIZE_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 2, 2, 256),
    "bert-tiny": (128, 2, 2, 512),
    "mini": (256, 4, 4, 1024),
    "small": (512, 4, 8, 2048),
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
}
SIZES = tuple(SIZE_PRESETS)


def read_hf_config(model_dir: Path) -> dict:
    """A Hugging Face model directory's ``config.json``, read without transformers (a dry run's checks)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise InputError(model_dir, "not a Hugging Face model directory", expected="config.json")
    return read_json_object(path, "a Hugging Face model config, a JSON object")


@dataclass(frozen=True)
class ModelConfig:
    size: Literal["tiny", "bert-tiny", "mini", "small", "base", "large"] = field(
        "tiny", help="architecture preset (tiny: hidden 64, 2 layers, for tests; bert-tiny/mini/small: Turc et "
                     "al.'s miniature BERTs, hidden 128/256/512; base/large: BERT's)")
    objective: Literal["mlm_nsp", "mlm"] = field(
        "mlm_nsp", help="mlm_nsp = BertForPreTraining (masked LM + next sentence), mlm = BertForMaskedLM")
    init_from: str = field("", help="continue from this Hugging Face BERT directory (missing heads are added); "
                                    "empty = train from scratch with `size`")
    allow_vocab_resize: bool = field(
        False, help="with init_from: resize the embeddings when the vocabulary differs (otherwise refused)")
    max_position_embeddings: int = field(512, help="longest sequence the model can take")
    dropout: float = field(0.1, help="hidden and attention dropout")

    def __post_init__(self):
        if self.max_position_embeddings < 8:
            raise ConfigError("model.max_position_embeddings must be >= 8")
        check_number("model.dropout", self.dropout, low=0, high=1, high_open=True)


@dataclass(frozen=True)
class PhaseConfig:
    max_seq_length: int = field(128, help="instances of this length are read (instances/len<L>)")
    steps: int = field(20, help="optimizer steps in this phase (0 = skip the phase); with a stopping rule "
                                "(pretrain.stop) the most it runs")
    global_batch_size: int = field(16, help="sequences per optimizer step over all workers")
    device_batch_size: int = field(
        8, help="sequences one worker processes per micro-batch; accumulation = global / (workers x this)")
    learning_rate: float = field(1e-3, help="peak learning rate")
    warmup_proportion: float = field(0.1, help="fraction of the phase's steps spent in linear warm-up")

    def __post_init__(self):
        if self.steps < 0:
            raise ConfigError("phase steps must be >= 0")
        if self.max_seq_length < 8:
            raise ConfigError(f"phase max_seq_length must be >= 8, got {self.max_seq_length}")
        if self.global_batch_size < 1 or self.device_batch_size < 1:
            raise ConfigError("phase global_batch_size and device_batch_size must be >= 1")
        check_number("phase learning_rate", self.learning_rate, low=0, low_open=True)
        check_number("phase warmup_proportion", self.warmup_proportion, low=0, high=1, high_open=True)


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["lamb", "adamw"] = field("lamb", help="LAMB (You et al. 2019, NVIDIA's recipe) or AdamW")
    weight_decay: float = field(0.01, help="decoupled weight decay (not on biases and LayerNorm)")
    beta1: float = field(0.9, help="first-moment decay")
    beta2: float = field(0.999, help="second-moment decay")
    eps: float = field(1e-6, help="denominator epsilon")
    grad_clip: float = field(1.0, help="clip the global gradient norm to this (0 = off)")
    decay_power: float = field(0.5, help="polynomial decay power after warm-up (NVIDIA: 0.5; 1.0 = linear)")

    def __post_init__(self):
        for name in ("beta1", "beta2"):
            check_number(f"optim.{name}", getattr(self, name), low=0, high=1, high_open=True)
        for name in ("weight_decay", "grad_clip"):
            check_number(f"optim.{name}", getattr(self, name), low=0)
        for name in ("eps", "decay_power"):
            check_number(f"optim.{name}", getattr(self, name), low=0, low_open=True)


@dataclass(frozen=True)
class StopConfig:
    window: int = field(50, help="stopping rules: steps per window; at each window's end the window's MLM loss "
                                 "(mean over its steps) and MLM accuracy (masked positions predicted right / "
                                 "masked positions), both summed over all workers, decide whether the phase stops")
    plateau_patience: int = field(
        0, help="stop a phase when this many windows in a row have not lowered its best windowed MLM loss by "
                "plateau_min_delta (seed 000: 'until the loss plateaus'); 0 = off")
    plateau_min_delta: float = field(
        0.01, help="the relative improvement that counts: a window's loss below best x (1 - plateau_min_delta)")
    mlm_accuracy: float = field(
        0.0, help="stop a phase at the end of the first window whose MLM accuracy on the training batches reaches "
                  "this (seed 003); 0 = off")

    def __post_init__(self):
        if self.window < 1:
            raise ConfigError("stop.window must be >= 1")
        if self.plateau_patience < 0:
            raise ConfigError("stop.plateau_patience must be >= 0")
        check_number("stop.plateau_min_delta", self.plateau_min_delta, low=0, high=1, high_open=True)
        check_number("stop.mlm_accuracy", self.mlm_accuracy, low=0, high=1)

    @property
    def enabled(self) -> bool:
        return self.plateau_patience > 0 or self.mlm_accuracy > 0


@dataclass(frozen=True)
class AdapterConfig:
    enabled: bool = field(False, help="train bottleneck adapters after each feed-forward block, base frozen "
                                      "(seed 002, Pfeiffer placement)")
    reduction_factor: int = field(16, help="bottleneck size = hidden_size / reduction_factor")
    train_heads: bool = field(True, help="also train the MLM/NSP heads (they are new when continuing)")

    def __post_init__(self):
        if self.reduction_factor < 1:
            raise ConfigError("adapters.reduction_factor must be >= 1")


@dataclass(frozen=True)
class SpeedConfig:
    """How the step is computed: each switch keeps the loss and gradients of the plain path (float rounding
    aside; tests/test_pretrain_speed.py checks each), so none is part of a run's key. The exception is
    ``fp8``, which rounds the matmuls' operands to 8 bits: on, it is part of the key."""
    masked_only_head: bool = field(
        True, help="apply the MLM decoder (transform + vocabulary projection) only at the masked positions, as "
                   "NVIDIA's recipe does, instead of at every position and then dropping the unmasked ones "
                   "(false): the same loss, without the projection of the ~85 percent of positions not masked")
    attention: Literal["sdpa", "eager"] = field(
        "sdpa", help="attention kernel: sdpa = torch's scaled_dot_product_attention (a fused FlashAttention / "
                     "memory-efficient kernel on CUDA); eager = transformers' matmul-softmax-matmul")
    fused_optimizer: bool = field(
        True, help="AdamW as one fused kernel (fused=True) on CUDA and CPU, multi-tensor (foreach) on other "
                   "devices; false = the per-tensor loop. LAMB is always multi-tensor")
    unpad: bool = field(
        True, help="run the encoder's projections, feed-forward blocks and LayerNorms on the real tokens only, "
                    "packed (pretrain/unpad.py), not on padding (a quarter of real instances' positions); the "
                    "attention runs padded with the padding masked. With compile, the packed encoder is compiled "
                    "with dynamic shapes")
    compile: bool = field(
        False, help="torch.compile the encoder (inductor; with unpad, the packed encoder with dynamic shapes; its "
                    "first steps compile, timed apart in the log). On an H200 it makes BERT-base's step 1.18x and "
                    "the small model's 1.29x faster than unpad alone, for 41 s / 20 s of compile per worker and "
                    "phase, repaid after ~1,700 / ~1,400 steps (benchmarks/RESULTS.md): off by default (the CPU "
                    "runs are short, and inductor takes minutes of CPU), on in configs/cluster.yaml")
    compile_head: bool = field(
        False, help="with compile: the MLM decoder, the NSP head and their losses compiled too, as one function with "
                    "dynamic shapes (pretrain/model.py head_losses), instead of ~50 eager operations a micro-batch: "
                    "the cross-entropy's passes over the masked positions' vocabulary logits fused, fewer kernels "
                    "for the host to issue (the compiled step is host-bound), and with cuda_graphs the head graphed "
                    "too. The same loss and gradients (tests). Not yet measured on a GPU: off by default")
    compile_optimizer: bool = field(
        False, help="LAMB's update torch.compile'd (pretrain/optim.py _lamb_update): its ~20 multi-tensor "
                    "operations a parameter group, each a pass over every weight, moment or gradient and several "
                    "launches, fused by inductor into a few kernels; the learning rate and bias corrections enter "
                    "as device tensors, so the schedule does not recompile it. Compiles once a run (on the first "
                    "step). The same update (tests). LAMB only (AdamW is one fused kernel on CUDA already). Not yet "
                    "measured on a GPU: off by default")
    cuda_graphs: bool = field(
        False, help="with compile: torch.compile's reduce-overhead mode, each shape's compiled encoder recorded "
                    "once as a CUDA graph and replayed as one launch (the compiled step is host-bound: the GPU "
                    "waits for the host to issue its ~2,700 kernels). Micro-batches then come in few shapes: rows "
                    "padded to the phase's length, packed tokens and masked positions rounded up to buckets "
                    "(filler the loss skips). Measured slower on an H200 (0.80x on BERT-base, 0.93x on the small "
                    "model, over 20 timed steps: benchmarks/RESULTS.md): off by default. On CPU: compiled, no "
                    "graphs")
    fp8: bool = field(
        False, help="the encoder layers' six linear layers multiply in FP8 (pretrain/float8.py: tensorwise dynamic "
                    "scaling, e4m3 forward, e5m2 gradients, float32 accumulation; H100/H200/L4-class GPUs), as "
                    "MLPerf's H100 BERT runs do; the embeddings, pooler and MLM head stay bf16. Needs precision "
                    "bf16, and compile to fuse the casts (without it, slower than bf16). Changes the arithmetic, so "
                    "part of the run's key when on; MFU stays against the bf16 peak. Measured 0.40x as fast as bf16 on "
                    "BERT-base on an H200 (its casts cost more than its matmuls save at K = 768): off")

    def __post_init__(self):
        if self.cuda_graphs and not self.compile:
            raise ConfigError("pretrain.speed.cuda_graphs needs pretrain.speed.compile: true (the graphs are "
                              "recorded from the compiled encoder)")
        if self.compile_head and not self.compile:
            raise ConfigError("pretrain.speed.compile_head needs pretrain.speed.compile: true (it extends the "
                              "compiled region from the encoder to the heads)")


@dataclass(frozen=True)
class PretrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig, help="model architecture / initialisation")
    phase1: PhaseConfig = field(default_factory=PhaseConfig, help="phase 1 (short sequences, e.g. 128)")
    phase2: PhaseConfig = field(default_factory=lambda: PhaseConfig(max_seq_length=512, steps=0),
                                help="phase 2 (long sequences, e.g. 512; steps 0 = skip)")
    optim: OptimConfig = field(default_factory=OptimConfig, help="optimiser and schedule")
    adapters: AdapterConfig = field(default_factory=AdapterConfig, help="adapter-based continued pretraining")
    stop: StopConfig = field(
        default_factory=StopConfig,
        help="stopping rules, applied to each phase afresh: a phase ends at its steps or when a rule fires, "
             "whichever comes first; the LR schedule stays defined over the phase's steps, so a phase stopped "
             "early ends before its learning rate has decayed. Off by default")
    precision: Literal["fp32", "bf16", "fp16"] = field(
        "fp32", help="fp32, bf16 autocast, or fp16 autocast with a dynamic gradient scaler")
    init_loss_scale: float = field(2.0 ** 16, help="fp16: initial loss scale")
    max_nonfinite_steps: int = field(
        20, help="stop with an error after this many consecutive steps with a NaN/inf loss")
    num_workers: int = field(2, help="Ray Train workers (one per GPU on a cluster)")
    use_gpu: bool = field(False, help="a GPU per worker (or the share resources_per_worker.GPU gives), NCCL; "
                                      "false = CPU workers, gloo")
    cpus_per_worker: float = field(1.0, help="CPUs reserved per worker")
    resources_per_worker: dict[str, float] = field(
        default_factory=dict, help="extra Ray resources per worker, custom ones or GPU: a share of a GPU (with "
                                  "use_gpu; e.g. 0.5 puts two pretraining jobs on one GPU, experiments' "
                                  "arm_concurrency); for a GPU model use accelerator_type")
    accelerator_type: str = field("", help="with use_gpu: the GPU model every worker needs, e.g. H100 or A100 "
                                           "(Ray's ScalingConfig accelerator_type); empty = any GPU")
    storage_path: str = field(
        "", help="where Ray Train persists the checkpoints: empty = <out_dir>/checkpoints; an object-store URI "
                 "(s3://bucket/prefix, gs://...) or a directory every node mounts (docs/CLUSTER.md)")
    shared_storage: bool = field(
        False, help="declare that out_dir, the instances, the tokenizer, model.init_from and a directory "
                    "storage_path are on a filesystem every node mounts at the same path (NFS, EFS, Lustre): "
                    "a multi-node run needs it")
    multi_node: bool = field(
        False, help="declare a run over several nodes, so a dry run checks what that needs (shared storage, an "
                    "MLflow server); a run also checks the Ray cluster it gets, whatever this says")
    checkpoint_every: int = field(0, help="save a checkpoint every N optimizer steps (0 = only at phase ends)")
    keep_checkpoints: int = field(2, help="keep the last K checkpoints")
    max_failures: int = field(1, help="restart the workers from the latest checkpoint this many times")
    log_every: int = field(1, help="record metrics every N steps")
    dataloader_prefetch: int = field(
        2, help="batches each worker prefetches from Ray Data, and optimizer steps of micro-batches it collates and "
                "masks ahead on a background thread while the device trains")
    ingest: Literal["auto", "local", "ray_data"] = field(
        "auto", help="how the workers get a phase's instances: ray_data streams them (Ray Data read tasks and a "
                     "split coordinator, for sets larger than a worker's memory), local has each worker read its "
                     "equal share of the parquet files itself and shuffle it whole each epoch (no Ray Data processes "
                     "to start: ~10-15 s less per run on 2 cores); auto = local up to 256 MiB of instance files a "
                     "phase. The two read the same rows in other orders, so an explicit value is part of the key")
    speed: SpeedConfig = field(
        default_factory=SpeedConfig, help="how the step is computed (kernels, decoder, compile): the same loss and "
                                          "gradients either way, so not part of the run's key (fp8 aside: it "
                                          "rounds the matmuls' operands, and is part of the key when on)")
    gradient_checkpointing: bool = field(
        False, help="recompute each layer's activations in the backward pass instead of keeping them (about a third "
                    "more compute for much less activation memory: longer sequences or larger device batches fit); "
                    "the same arithmetic, so not part of the run's key")
    seed: int = field(42, help="seed for initialisation and masking")
    on_mismatch: Literal["refuse", "restart"] = field(
        "refuse", help="checkpoints in out_dir from another config or other inputs: refuse, saying what changed, "
                       "or restart (discard them and train from scratch)")

    def __post_init__(self):
        if self.num_workers < 1:
            raise ConfigError("num_workers must be >= 1")
        if self.phase1.steps + self.phase2.steps < 1:
            raise ConfigError("phase1.steps + phase2.steps must be >= 1")
        for name, phase in self.active_phases():
            if phase.max_seq_length > self.model.max_position_embeddings:
                raise ConfigError(f"{name}.max_seq_length {phase.max_seq_length} exceeds "
                                  f"model.max_position_embeddings {self.model.max_position_embeddings}")
            # Fail at config time, not hours into a cluster run, when the batch does not divide.
            batch_plan(phase.global_batch_size, self.num_workers, phase.device_batch_size, where=name)
        if self.max_nonfinite_steps < 1 or self.log_every < 1:
            raise ConfigError("max_nonfinite_steps and log_every must be >= 1")
        if self.dataloader_prefetch < 1:
            raise ConfigError("dataloader_prefetch must be >= 1")
        if self.ingest not in ("auto", "local", "ray_data"):
            raise ConfigError(f"ingest must be auto, local or ray_data, not {self.ingest!r}")
        if self.speed.fp8 and self.precision != "bf16":
            raise ConfigError(f"pretrain.speed.fp8 needs precision bf16 (the matmuls around the FP8 ones run in bf16), "
                              f"not {self.precision}")
        if self.speed.compile_optimizer and self.optim.name != "lamb":
            raise ConfigError(f"pretrain.speed.compile_optimizer compiles LAMB's update; optim.name is "
                              f"{self.optim.name} (AdamW is one fused kernel on CUDA already: "
                              "speed.fused_optimizer): set compile_optimizer false")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1 or self.max_failures < 0:
            raise ConfigError("checkpoint_every >= 0, keep_checkpoints >= 1, max_failures >= 0")
        check_number("init_loss_scale", self.init_loss_scale, low=0, low_open=True)
        # Ray's raylet aborts (a C++ check) on a negative resource request, after the job has started
        check_number("cpus_per_worker", self.cpus_per_worker, low=0)
        for name, amount in self.resources_per_worker.items():
            check_number(f"resources_per_worker.{name}", amount, low=0)
        if self.accelerator_type and not self.use_gpu:
            raise ConfigError(f"accelerator_type {self.accelerator_type!r} needs use_gpu=true")
        gpu = self.resources_per_worker.get("GPU")
        # Ray Train refuses a share without use_gpu only once the job has started, and reads a share of 0 as a
        # whole GPU
        if gpu is not None and (not self.use_gpu or gpu == 0):
            raise ConfigError(f"resources_per_worker.GPU {gpu}: a worker's share of a GPU needs use_gpu=true and a "
                              "share above 0 (CPU workers: leave GPU out)")
        pinned = [k for k in self.resources_per_worker if k.startswith("accelerator_type:")]
        if pinned:  # Ray gives each node one unit of it: two workers asking 1 each never fit one node
            raise ConfigError(f"resources_per_worker {pinned[0]}: a node has one unit of it, so a multi-GPU node "
                              f"would hold one worker and the job hang; set accelerator_type="
                              f"{pinned[0].split(':', 1)[1]} instead")

    def active_phases(self) -> list[tuple[str, PhaseConfig]]:
        """The phases with steps > 0, in order."""
        return [(n, p) for n, p in (("phase1", self.phase1), ("phase2", self.phase2)) if p.steps > 0]

    @property
    def total_steps(self) -> int:
        return self.phase1.steps + self.phase2.steps

    def training_fields(self) -> dict:
        """The settings a trained model depends on: not how often it is saved or logged, where its
        workers run, or what to do with an old run; the stopping rules only when one is set."""
        operational = {"keep_checkpoints", "max_failures", "log_every", "checkpoint_every", "cpus_per_worker",
                       "resources_per_worker", "accelerator_type", "dataloader_prefetch", "on_mismatch",
                       "gradient_checkpointing", "speed", "storage_path", "shared_storage", "multi_node"}
        fields = {k: v for k, v in to_dict(self).items() if k not in operational}
        if self.ingest == "auto":  # the key runs had before ingest existed; auto's choice follows the inputs' key
            del fields["ingest"]
        if not self.stop.enabled:  # without a rule a run keeps the key it had before rules existed
            del fields["stop"]
        if self.speed.fp8:  # rounds the matmuls' operands: another model (off, the key runs always had)
            fields["fp8"] = True
        if self.model.init_from:  # the model it continues from, by its contents (its path alone kept a model
            # continued from other weights put at the same path: a probe, session 46)
            fields["init_from_identity"] = model_identity(self.model.init_from)
        return fields


def check_init_positions(cfg: PretrainConfig) -> None:
    """Each phase's length fits the positions of the model continued (``model.init_from``): that model's own,
    not ``model.max_position_embeddings`` (checked in ``__post_init__``). Read from its config.json alone
    (a directory without one is said by the checks of its files)."""
    source = Path(cfg.model.init_from) / "config.json" if cfg.model.init_from else None
    if source is None or not source.is_file():
        return
    positions = read_hf_config(source.parent).get("max_position_embeddings")
    for name, phase in cfg.active_phases():
        if isinstance(positions, int) and phase.max_seq_length > positions:
            raise InputError(source, f"max_position_embeddings is {positions}, fewer than {name}.max_seq_length "
                                     f"{phase.max_seq_length} (model.init_from)",
                             expected=f"a model with >= {phase.max_seq_length} positions, or {name}.max_seq_length "
                                      f"<= {positions}")


def pretrain_key(cfg: PretrainConfig, instances: dict[int, str], vocab: str) -> str:
    """What a pretraining run is, and the one key of its output: its training settings, its instances
    (each length's instances-stage key) and its vocabulary (the vocab stage's key). The runner computes
    it from configs before anything is built (an experiment's folder is named by it); the trainer
    computes it from the keys its inputs record (``input_keys``) and records it. A resume must match
    it; a finished output is reused by it."""
    return _key(cfg.training_fields(), instances, vocab)


def _key(fields: dict, instances: dict[int, str], vocab: str) -> str:
    return content_key("pretrain", fields, {f"instances/len{n}": key for n, key in sorted(instances.items())}, vocab)


def relocated_pretrain_key(cfg: PretrainConfig, instances: dict[int, str], vocab: str, out_dir: str | Path = "",
                           beside: bool = True, place: Callable[[str], Path] | None = None) -> str:
    """``pretrain_key``, or the key of a pretraining output at ``out_dir`` (or, ``beside``, next to it) that this
    config made continuing from a model of the same files at another path (``model.init_from`` installed in another
    environment, a checkout cloned or moved): its key computed with the ``init_from`` it records, the model's
    identity read where it is now (``core.reuse.relocated_key``). A finished output (its ``final/`` written: its
    manifest) is reused; failing one, a run stopped before its end (its checkpoints' run record,
    ``checkpoint.run_in_progress``) is resumed, its resume check finding the key it records. The trainer and the
    dry run check ``out_dir`` alone; the runner gives ``place(key)``, its layout's folder of a key, and an output
    answers there only (beside a chain's ``pretrain/`` is not its output)."""
    fields = cfg.training_fields()
    key = _key(fields, instances, vocab)
    if not cfg.model.init_from:
        return key

    def key_at(made: dict) -> str | None:
        config = made.get("config")
        model = config.get("model") if isinstance(config, dict) else None
        path = model.get("init_from") if isinstance(model, dict) else None
        if not (isinstance(path, str) and path):
            return None
        return _key({**fields, "model": {**fields["model"], "init_from": path}}, instances, vocab)

    here = place(key) if place is not None else Path(out_dir)
    for record, said in ((_finished, "was made from inputs of the same contents at other paths: it is reused, "
                                     "with the outputs made from it"),
                         (run_in_progress, "was started from inputs of the same contents at other paths and stopped "
                                           "before its end: it resumes from its checkpoints")):
        found = relocated_key("pretrain", key, here, key_at, beside=beside, record=record, said=said)
        if found != key and (place is None or _records(record, place(found)) == found):
            return found
    return key


def _finished(out_dir: Path) -> dict:
    """A finished pretraining output's manifest (its ``final/`` written); FileNotFoundError: none."""
    if not (Path(out_dir) / "final" / "config.json").is_file():
        raise FileNotFoundError(f"{out_dir} has no final/: not a finished pretraining output")
    return read_manifest(out_dir)


def _records(record: Callable[[Path], dict], out_dir: Path) -> str | None:
    try:
        return record(out_dir).get(KEY_FIELD)
    except (FileNotFoundError, NotADirectoryError, InputError):
        return None


def started_as(cfg: PretrainConfig, ckpt_dir: Path) -> PretrainConfig:
    """``cfg`` as the run whose record ``ckpt_dir`` holds was started: its ``model.init_from`` the path that record
    names. A run resumed from the same files at another path (``relocated_pretrain_key``) keeps the key of the path
    it started from; its output's manifest records that path, so that it answers as any output made there does."""
    try:
        model = read_json_object(Path(ckpt_dir) / RUN_RECORD, "a pretraining run record")["config"]["model"]
    except (FileNotFoundError, InputError, KeyError, TypeError):
        return cfg
    path = model.get("init_from") if isinstance(model, dict) else None
    if not (cfg.model.init_from and isinstance(path, str) and path) or path == cfg.model.init_from:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=path))


def input_keys(instances: dict[int, Path], tokenizer_dir: Path) -> tuple[dict[int, str], str]:
    """The keys ``pretrain_key`` takes, read from the inputs on disk: each instances directory's recorded
    key, and the vocabulary's (a tokenizer directory that is no vocab-stage output, e.g. a published
    model's: the hash of its vocab.txt)."""
    vocab = Path(tokenizer_dir)
    if (vocab / "manifest.json").is_file():
        vocab_key = output_key(vocab)
    else:
        vocab_key = file_sha256(vocab / "vocab.txt") if (vocab / "vocab.txt").is_file() else ""
    return {int(n): output_key(p) for n, p in instances.items()}, vocab_key


def input_settings(instances: list[Path]) -> dict:
    """The settings of what pretraining reads, for its MLflow run's params (``input.corpus.*``, ``input.vocab.*``,
    ``input.instances.*``): the corpus, vocabulary and instances stages' configs as their manifests record them,
    so runs that differ only there (an experiment's mixing or AmpV arms) are told apart. A stage whose manifest
    is not there (inputs made elsewhere) is left out."""
    settings: dict = {}
    for path in [Path(p) for p in instances[:1]]:  # the lengths share one corpus and vocabulary
        try:
            manifest = read_json_object(path / "manifest.json", "a stage manifest")
            settings["instances"] = manifest.get("config") or {}
            for upstream in manifest.get("inputs") or []:
                found = read_json_object(Path(upstream) / "manifest.json", "a stage manifest")
                if found.get("stage") in ("corpus", "vocab"):
                    settings[found["stage"]] = found.get("config") or {}
        except (InputError, OSError, TypeError):
            continue
    return settings


def run_params(cfg: PretrainConfig, instances: list[Path]) -> dict:
    """A pretraining run's MLflow params: its config, and its inputs' settings under ``input`` (``input_settings``)."""
    return {**to_dict(cfg), "input": input_settings(instances)}


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one global batch is produced: ``workers x device_batch x accumulation == global_batch``."""
    global_batch: int
    workers: int
    device_batch: int
    accumulation: int


def batch_plan(global_batch: int, workers: int, device_batch: int, where: str = "batch") -> BatchPlan:
    """The one place a global batch becomes per-device batch x accumulation steps.

    Raises ConfigError when ``global_batch`` is not ``workers x device_batch x k``: silently
    training on a different batch than the recipe says is how reproductions drift.
    """
    if global_batch < 1 or workers < 1 or device_batch < 1:
        raise ConfigError(f"{where}: global batch, workers and device batch must be >= 1")
    per_step = workers * device_batch
    if global_batch % per_step:
        raise ConfigError(f"{where}: global_batch_size {global_batch} is not divisible by num_workers {workers} "
                          f"x device_batch_size {device_batch} = {per_step}")
    return BatchPlan(global_batch, workers, device_batch, global_batch // per_step)


def data_passes(steps: int, global_batch: int, instances: int) -> float:
    """The passes a phase makes over its instances: the sequences its steps draw (steps x global batch) over
    the instance count (each worker's epoch drops its last part-batch, so a pass holds slightly fewer)."""
    return steps * global_batch / max(1, instances)


def passes_text(steps: int, global_batch: int, instances: int | None, masking: str | None) -> str:
    """A phase's passes over its instances in words (the dry run's and the run's phase lines): unknown before
    the instances stage has run; with static masks and more than one pass, that passes after the first see the
    masks of the first (BERT's remedy: dupe_factor, more copies of the text, each masked anew)."""
    if instances is None:
        return "passes over its instances: known once the instances stage has run"
    passes = data_passes(steps, global_batch, instances)
    text = f"{steps * global_batch:,} sequences = {passes:.2f} passes over {instances:,} instances"
    if masking == "static" and passes > 1:
        text += ("; static masks: passes after the first see the same masks (BERT's remedy: a larger "
                 "corpus.mixer.dupe_factor, each copy masked anew; or instances.masking: dynamic, not with "
                 "entity masking)")
    return text
