"""The options of one training run (:class:`TrainConfig`) and the ``repro train`` command line.

Kept apart from :mod:`repro.train` (the per-rank loop) so that reading, checking and explaining the
options never imports torch: ``repro train --help`` and ``repro launch``'s checks of a run made before
any rank starts are quick. :mod:`repro.train` re-exports everything here.
"""

from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Sequence

from repro.core import ranges
from repro.core.text import DefaultsHelpFormatter
from repro.costs.presets import preset_names
from repro.core.families import get_family
from repro.core.plan import WIRE_DTYPE_BYTES
from repro.core.run_options import RUN_OPTIONS, check_run_options, check_wire_dtype, refuse_given_options
from repro.results.runs import check_run_id
from repro.core.schedulers import get_scheduler, scheduler_names
from repro.workload.catalog import MODEL_NAMES, model_info

__all__ = ["TrainConfig", "VIEWS", "OPTIMIZERS", "REFUSED_OPTIMIZERS", "DEVICES", "AMP_DTYPES", "FIELD_RANGES",
           "build_parser", "config_from_argv", "step_memory_floor_bytes", "check_step_memory"]

#: layer granularities of a plan (the same as :data:`repro.workload.layers.VIEWS`, which imports torch)
VIEWS = ("tensor", "module")

#: ``--optimizer`` names (lower case; the option is case-insensitive) -> the ``torch.optim`` class,
#: torch-free so a bad name is refused before any rank starts. ``sgd`` gets ``lr``, ``momentum`` and
#: ``weight_decay``, the others ``lr`` and ``weight_decay`` where their constructor takes them.
OPTIMIZERS: dict[str, str] = {name.lower(): name for name in (
    "SGD", "AdamW", "Adam", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "Adafactor", "RMSprop", "Rprop",
    "ASGD")}

#: ``torch.optim`` classes that ``repro train``'s loop cannot drive, with the reason (refused in one line)
REFUSED_OPTIMIZERS: dict[str, str] = {
    "lbfgs": "LBFGS steps with a closure that re-evaluates the loss; repro train takes one step per batch",
    "sparseadam": "SparseAdam takes sparse gradients only, and the models' gradients are dense",
    "muon": "Muon updates 2-D weight matrices only, and every model here has other parameters (biases, norms, "
            "convolutions)",
}

#: ``--device`` values (``cuda``: this rank's own GPU, ``cuda:LOCAL_RANK``)
DEVICES = ("cpu", "cuda")

#: ``--amp`` values -> the ``torch.autocast`` dtype of the forward and the loss (by name; None: off).
#: ``fp16`` also scales the loss with a ``torch.amp.GradScaler`` (bf16 has float32's range: no scaler)
AMP_DTYPES: dict[str, str | None] = {"off": None, "bf16": "bfloat16", "fp16": "float16"}

#: schedulers that cannot take a GradScaler, hence ``--amp fp16``, and why (refused in one line)
AMP_FP16_REFUSED = {
    "fsdp": "its gradients are DTensor shards, which repro.distribute's GradScaler step does not unscale "
            "(docs/conformance.md)",
}
#: ``--amp fp16`` with a parameter-server scheduler: ``repro train`` runs its servers on ranks of their own
_AMP_FP16_SERVERS = ("its dedicated server ranks apply the pushed gradients without a GradScaler's verdict "
                     "(repro.distribute takes a scaler with co-located servers only)")


#: The plausible range of every numeric common setting (bounds argued in :mod:`repro.core.ranges`; the run
#: options declare theirs), checked when the config is made: one line naming the flag.
FIELD_RANGES: dict[str, ranges.Quantity] = {
    "batch_size": ranges.BATCH_SIZE, "steps": ranges.COUNT, "epochs": ranges.COUNT,
    "warmup_steps": ranges.COUNT, "compute_steps": ranges.COUNT, "fit_repeats": ranges.REPEATS,
    "lr": ranges.LEARNING_RATE, "momentum": ranges.MOMENTUM, "weight_decay": ranges.WEIGHT_DECAY,
    "seed": ranges.SEED, "checkpoint_every_min": ranges.MINUTES, "checkpoint_stop_at_step": ranges.COUNT,
    "num_workers": ranges.LOADER_WORKERS, "emulated_bandwidth_bps": ranges.BITS_PER_S,
}
#: ``model_kwargs``' numbers (``--seq-len``; num_classes from Python)
MODEL_KWARG_RANGES: dict[str, ranges.Quantity] = {"seq_len": ranges.SEQ_LEN, "num_classes": ranges.CLASSES}


def _flag(name: str) -> str:
    """How a field is spelled in a message: its flag (``--batch-size``), or its name if it has none."""
    return name if name in ("emulated_bandwidth_bps",) else "--" + name.replace("_", "-")


def _opt(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass
class _CommonConfig:
    """The settings every run has (:class:`TrainConfig` adds the run options of every family)."""

    model: str = _opt("tiny_resnet", f"model: {', '.join(MODEL_NAMES)} (`repro models` describes them)")
    scheduler: str = _opt("mgwfbp", f"gradient-exchange scheduler: {', '.join(scheduler_names())} (`repro "
                                    "schedulers` describes them)")
    dataset: str = _opt("synthetic", "data: synthetic (throughput), digits, cifar10, imagenet, ptb")
    batch_size: int = _opt(32, "samples per rank per step")
    steps: int = _opt(20, "timed steps (synthetic data); ignored when --epochs is given")
    epochs: int | None = _opt(None, "convergence run: full passes over a real dataset", kind=int)
    warmup_steps: int = _opt(3, "untimed steps first (plan schedulers measure the trace in them)")
    compute_steps: int = _opt(5, "extra steps without communication: the computation-only time")
    view: str = _opt("tensor", "layer granularity of the plan", choices=VIEWS)
    wire_dtype: str | None = _opt(None, "communicate gradients in this dtype (default: the model's, float32, "
                                  "which every scheduler takes; float16/bfloat16: the schedulers that cast)",
                                  choices=tuple(WIRE_DTYPE_BYTES))
    amp: str = _opt("off", "mixed-precision compute: the forward and the loss under torch.autocast in bfloat16 "
                    "(bf16) or float16 (fp16, with a torch.amp.GradScaler scaling the loss); the weights, "
                    "gradients and optimizer stay float32, and --wire-dtype alone sets what the exchange "
                    "sends", choices=tuple(AMP_DTYPES))
    plan: str | None = _opt(None, "execute this plan file (from `repro plan`) as it is, from the first step: no "
                            "warm-up trace and no cost fit; the scheduler becomes the plan's solver (or stays "
                            "--scheduler if it runs that plan family) and the view the plan's recorded one")
    network: str | None = _opt(None, "plan with this cost preset (`repro presets` lists them) or cost file (JSON "
                               "of `repro calibrate` or `repro cost fit`, for this P) instead of fitting on the "
                               "live group")
    fit_repeats: int = _opt(5, "repeats per message size (and per top-k size) when fitting the cost model")
    optimizer: str = _opt("sgd", "optimizer: a torch.optim class name, case-insensitive: "
                          f"{', '.join(OPTIMIZERS.values())}; sgd takes --momentum, every one --lr and (where it "
                          "has one) --weight-decay")
    lr: float = _opt(0.05, "learning rate")
    momentum: float = _opt(0.9, "SGD momentum (sgd only)")
    weight_decay: float = _opt(1e-4, "weight decay, for the optimizers that take one (decoupled for adamw)")
    seed: int = _opt(0, "seed of the model weights and the data")
    record_timeline: bool = _opt(False, "record each message's launch and end time of the last step")
    results_dir: str | None = _opt(None, "write the run folder under this directory (rank 0)")
    run_id: str | None = _opt(None, "name of the run folder (default: model_scheduler_pP_<ms timestamp>)")
    overwrite: bool = _opt(False, "replace an existing run folder of the same id (whole)")
    quiet: bool = _opt(False, "no progress bar")
    checkpoint_every_min: float = _opt(0.0, "write an in-run checkpoint every this many minutes of wall-clock time, "
                                       "and on SLURM's pre-timeout signal (SIGUSR1); a rerun with the same "
                                       "--run-id and --results-dir resumes from it (0: off; needs both flags; "
                                       "repro.training.checkpoint)", kind=float)
    checkpoint_stop_at_step: int | None = _opt(None, "behave as if SIGUSR1 reached the first rank after this many "
                                               "timed steps: checkpoint, then exit with status 75 (tests, drills; "
                                               "needs --checkpoint-every-min >= 0 and the two flags above)", kind=int)
    device: str | None = _opt(None, "where each rank trains: cpu, or cuda (its own GPU, cuda:LOCAL_RANK); default: "
                              "cuda when the backend is nccl, else cpu (refused in one line if CUDA is not "
                              "available; nccl needs cuda)", choices=DEVICES)
    num_workers: int | None = _opt(None, "loader processes per rank for a real dataset (default: 0 on a CPU; on a "
                                   "GPU up to 4, within the rank's share of the CPUs; batches pinned there)", kind=int)
    # Set by the launcher, not on the command line: the emulated link rate the ranks ran on (recorded).
    emulated_bandwidth_bps: float | None = _opt(None, "", cli=False)
    model_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})

    def __post_init__(self) -> None:
        from repro.workload.datasets import DATASET_NAMES

        sched = get_scheduler(self.scheduler)
        self.scheduler = sched.name  # an old alias becomes the current name
        plan_wire_dtype = None
        if self.plan is not None:
            sched, plan_wire_dtype = self._take_plan(sched)
        spec = model_info(self.model)
        self._check_model_kwargs(spec)
        if self.dataset not in DATASET_NAMES:
            raise ValueError(f"unknown dataset '{self.dataset}'; choose one of {', '.join(DATASET_NAMES)}")
        if self.dataset == "synthetic" and self.epochs is not None:
            raise ValueError("epochs need a real dataset (e.g. --dataset digits); synthetic runs use --steps")
        self._check_optimizer()
        if self.num_workers is not None and (isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int)
                                             or self.num_workers < 0):
            raise ValueError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.device is not None:
            if not isinstance(self.device, str) or self.device.lower() not in DEVICES:
                raise ValueError(f"unknown device {self.device!r}; choose cpu or cuda (or leave it out: cuda when "
                                 "the backend is nccl, else cpu)")
            self.device = self.device.lower()
        if self.view not in VIEWS:
            raise ValueError(f"unknown view '{self.view}'; choose one of {', '.join(VIEWS)}")
        if self.wire_dtype is not None and self.wire_dtype not in WIRE_DTYPE_BYTES:
            raise ValueError(f"unknown wire dtype '{self.wire_dtype}'; choose one of {', '.join(WIRE_DTYPE_BYTES)}")
        self.wire_dtype = check_wire_dtype(self.wire_dtype, sched)
        self._check_amp(sched)
        for name in ("batch_size", "fit_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        self.seed = int(self.seed)  # e.g. a numpy integer from a notebook's grid
        for name in ("warmup_steps", "compute_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({_flag(name)}) must be >= 0, got {getattr(self, name)!r}")
        if self.epochs is None and self.steps < 1:
            raise ValueError(f"steps must be positive, got {self.steps}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        checked = check_run_options({name: getattr(self, name) for name in RUN_OPTIONS}, sched, where="flag",
                                    settings={"wire_dtype": self.wire_dtype or plan_wire_dtype, "device": self.device})
        for name, value in checked.items():  # set where it does not apply: refused, never silently ignored
            setattr(self, name, value)
        for name in ("lr", "momentum", "weight_decay"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite non-negative number, got {v}")
        if self.warmup_steps < 1 and sched.has_plan and self.plan is None:
            raise ValueError(f"'{self.scheduler}' plans from the warm-up: it needs warmup_steps >= 1")
        if self.network is not None:
            if Path(self.network).exists() and not Path(self.network).is_file():  # as read_input words it
                kind = "a folder" if Path(self.network).is_dir() else "not a regular file (a device, pipe or socket)"
                raise ValueError(f"--network {self.network} is {kind}, not a cost file")
            if self.network not in preset_names() and not _is_cost_file(self.network):
                raise ValueError(f"unknown network preset '{self.network}' (and no cost file of that name); known: "
                                 f"{', '.join(preset_names())}")
        if self.run_id is not None:
            check_run_id(self.run_id)
        self._check_checkpointing()
        self._check_ranges()  # last: the checks above say what a wrong type or sign means

    def _check_ranges(self) -> None:
        """Every number in its plausible range (:data:`FIELD_RANGES`), after the type and sign checks."""
        for name, quantity in FIELD_RANGES.items():
            value = getattr(self, name)
            if value is not None:
                ranges.check(quantity, value, _flag(name), what="option")

    def _check_optimizer(self) -> None:
        """``optimizer``: a name of :data:`OPTIMIZERS`, any case; kept in lower case (``sgd``, ``adamw``, ...)."""
        key = self.optimizer.lower() if isinstance(self.optimizer, str) else None
        if key in REFUSED_OPTIMIZERS:
            raise ValueError(f"optimizer '{self.optimizer}' is not supported: {REFUSED_OPTIMIZERS[key]}")
        if key not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS.values())} "
                             "(torch.optim class names, any case)")
        self.optimizer = key

    def _check_amp(self, sched) -> None:
        """``amp``: a key of :data:`AMP_DTYPES` (any case); ``fp16`` refused with a scheduler that cannot take
        the GradScaler it needs."""
        key = self.amp.lower() if isinstance(self.amp, str) else self.amp
        if key not in AMP_DTYPES:
            raise ValueError(f"unknown amp {self.amp!r}; choose one of {', '.join(AMP_DTYPES)}")
        self.amp = key
        if key != "fp16":
            return
        why = AMP_FP16_REFUSED.get(sched.name)
        if why is None and sched.family is not None and get_family(sched.family).server:
            why = _AMP_FP16_SERVERS
        if why is not None:
            raise ValueError(f"--amp fp16 needs a GradScaler, which '{sched.name}' cannot take: {why}; use --amp bf16 "
                             "(no scaler) or an all-reduce, sparse, DeAR or ByteScheduler scheduler")

    def amp_device_check(self, device_type: str) -> None:
        """``amp`` on ``device_type`` (``cpu``/``cuda``): fp16 with an LSTM model on a CPU is refused (torch
        has no float16 LSTM kernel there)."""
        if self.amp == "fp16" and device_type == "cpu" and model_info(self.model).family == "lm":
            raise ValueError(f"--amp fp16 on a CPU: torch has no float16 LSTM kernel there, and '{self.model}' is an "
                             "LSTM; use --amp bf16 on a CPU, or train on a GPU (--device cuda)")

    def _take_plan(self, sched):
        """``--plan FILE``: load it, take the scheduler that runs it and its view; returns the scheduler
        entry and the plan's wire dtype (another ``--wire-dtype`` is refused)."""
        from repro.core.outputs import read_input
        from repro.core.plan import Plan, PlanError

        try:  # a folder, a FIFO or a device: "not a regular file", as every command says (read_input)
            plan = read_input("plan", self.plan, Plan.load)
        except (OSError, ValueError, PlanError) as e:
            raise ValueError(_plan_error(self.plan, e)) from None
        solver = plan.solver if plan.solver in scheduler_names() else None
        if solver is not None and get_scheduler(solver).family == plan.family:
            sched = get_scheduler(solver)  # the run is recorded under the planner that made the plan
            self.scheduler = sched.name
        elif sched.family != plan.family:
            raise ValueError(f"--plan {self.plan} is a '{plan.family}' plan; give --scheduler one that runs that "
                             f"family ({', '.join(n for n in scheduler_names() if get_scheduler(n).family == plan.family)})")
        view = (plan.meta.get("provenance") or {}).get("view")
        if view is not None and view not in VIEWS:  # not silently the default: the layer names are in it
            raise ValueError(f"--plan {self.plan}: plan field 'provenance.view' is {ranges.show(view)}, not "
                             f"one of {', '.join(VIEWS)}")
        if view is not None:
            self.view = view
        if self.wire_dtype not in (None, plan.wire_dtype):
            fixed = plan.wire_dtype or "the gradients' own dtype"
            raise ValueError(f"--wire-dtype {self.wire_dtype} does not apply with --plan {self.plan}: a plan fixes its "
                             f"wire dtype ({fixed}); make the plan with --wire-dtype instead")
        return sched, plan.wire_dtype

    def _check_model_kwargs(self, spec) -> None:
        """``model_kwargs`` (e.g. ``--seq-len``): ones the model takes, with values it can build with."""
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"model_kwargs must be a dict, got {type(self.model_kwargs).__name__}")
        bad = sorted(set(self.model_kwargs) - set(spec.kwargs))
        if bad:
            raise ValueError(f"model '{self.model}' does not take {', '.join(bad)} (it takes: "
                             f"{', '.join(spec.kwargs) or 'nothing'})")
        for name, quantity in MODEL_KWARG_RANGES.items():
            v = self.model_kwargs.get(name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name} must be a positive integer, got {v!r}")
                ranges.check(quantity, v, _flag(name), what="option")

    @property
    def checkpointing(self) -> bool:
        """Whether in-run checkpoints are on (:mod:`repro.training.checkpoint`)."""
        return self.checkpoint_every_min > 0 or self.checkpoint_stop_at_step is not None

    def _check_checkpointing(self) -> None:
        v = self.checkpoint_every_min
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            raise ValueError(f"checkpoint_every_min must be a finite number of minutes >= 0 (0: off), got {v!r}")
        self.checkpoint_every_min = float(v)
        s = self.checkpoint_stop_at_step
        if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1):
            raise ValueError(f"checkpoint_stop_at_step must be a positive number of steps, got {s!r}")
        if not self.checkpointing:
            return
        if not self.results_dir or not self.run_id:
            raise ValueError("in-run checkpoints (--checkpoint-every-min) need --results-dir and --run-id: a rerun "
                             "finds its checkpoint by them")
        if self.serving_ranks():
            raise ValueError(f"'{self.scheduler}' runs dedicated server ranks, which in-run checkpoints do not cover; "
                             "leave --checkpoint-every-min out (or 0)")

    def check_plan_layers(self, world_size: int | None = None) -> None:
        """ValueError unless ``--plan``'s layers are exactly the model's (built on the meta device) and,
        given the job's ``world_size`` (servers included), the plan is for its number of workers."""
        if self.plan is None:
            return
        from repro.core.outputs import read_input
        from repro.core.plan import Plan, check_plan_workers, plan_fit_refusal
        from repro.workload.layers import VIEWS, layer_parameters
        from repro.workload.models import build_model

        plan = read_input("plan", self.plan, Plan.load)  # read and checked in __post_init__ already
        model = build_model(self.model, device="meta", **self.model_kwargs)
        views = {v: list(layer_parameters(model, v)) for v in VIEWS}
        refusal = plan_fit_refusal(plan, views[self.view], self.view, model=f"--model {self.model}",
                                   source=f"--plan {self.plan}", views=views)
        if refusal is not None:
            raise ValueError(refusal)
        if world_size is not None:
            check_plan_workers(plan, world_size - self.serving_ranks(), self.plan)

    def serving_ranks(self) -> int:
        """Ranks that serve rather than train: ``servers`` for a family with serving ranks, else 0."""
        sched = get_scheduler(self.scheduler)
        if self.server_placement == "colocated":
            return 0
        return (self.servers or 1) if sched.family is not None and get_family(sched.family).server else 0

    def check_world(self, world_size: int, backend: str | None = None, device: str | None = None) -> None:
        """Checks that need the world size (servers included) and, if given, the ``backend`` and the ranks'
        device type (default: ``--device``, else the backend's); made before any step."""
        sched = get_scheduler(self.scheduler)
        serving = self.serving_ranks()
        device = device or self.device or {"nccl": "cuda", "gloo": "cpu"}.get(backend or "")
        if device is not None:
            self.amp_device_check(device)
        if serving and backend == "nccl":
            raise ValueError(f"'{self.scheduler}' runs {serving} dedicated server rank(s), which serve each worker "
                             "from a thread of its own, point to point, and NCCL does not support that: they need "
                             "the gloo backend, or --server-placement colocated")
        device = device or "cpu"
        family = get_family(sched.family) if sched.family is not None else None
        if backend == "gloo" and device.startswith("cuda") and family is not None and family.gloo_cpu_only:
            raise ValueError(f"'{self.scheduler}' cannot train CUDA tensors over gloo: {family.gloo_cpu_only}; use "
                             "--backend nccl (one GPU per rank) or --device cpu")
        if serving:
            if world_size - serving < 2:
                raise ValueError(f"'{self.scheduler}' runs {serving} server rank(s) and needs at least 2 workers "
                                 f"besides: at least {serving + 2} ranks, got {world_size}")
            world_size -= serving  # the cost model is for the workers
        if sched.has_plan and world_size < 2:
            raise ValueError(f"'{self.scheduler}' exchanges gradients between ranks: it needs at least 2 ranks (got "
                             f"{world_size}); the one-worker baseline is --scheduler local")
        if self.network is not None:
            from repro.costs.cluster_cost import (  # a preset, or a cost file (repro calibrate, repro cost fit)
                load_cost)

            cost = load_cost(self.network, max(2, world_size), flag="--network")  # a P it lacks fails here
            if sched.family is not None:  # ... and one without the collective the plan family sends
                for collective in get_family(sched.family).collectives:
                    if collective not in cost.lines:
                        kind = "cost file" if _is_cost_file(self.network) else "network preset"
                        raise ValueError(f"{kind} '{self.network}' has no {collective} line, which "
                                         f"'{self.scheduler}' ({sched.family} family) plans with; choose a "
                                         f"preset that has one or leave --network out to fit on the live group")


def _option_fields() -> list[tuple[str, Any, Any]]:
    """One field per run option of :data:`repro.core.run_options.RUN_OPTIONS` (declared once, by its family)."""
    out = []
    for option in RUN_OPTIONS.values():
        meta: dict[str, Any] = {"help": option.help + (f" ({option.unit})" if option.unit and option.unit not in
                                                       option.help else ""), "kind": option.kind}
        if option.choices:
            meta["choices"] = option.choices
        kind = option.kind if option.default is not None else (option.kind | None)
        out.append((option.name, kind, field(default=option.default, metadata=meta)))
    return out


TrainConfig = make_dataclass(
    "TrainConfig", _option_fields(), bases=(_CommonConfig,),
    namespace={"__module__": __name__, "__qualname__": "TrainConfig",
               "__doc__": "One run: the common settings and every family's run options (:mod:`repro.core.run_options`; "
                          "None: the planner's default). Sizes in bytes, times in seconds; ``batch_size`` is per "
                          "rank."})


def _plan_error(path: str, e: BaseException) -> str:
    """The first line of a plan loader's error, naming ``--plan PATH`` once (the loaders name the file)."""
    text = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    if text == f"plan file not found: {path}":
        return f"--plan {path}: no such file"
    for prefix in (f"plan {path} ", f"{path}: "):
        if text.startswith(prefix):
            rest = text[len(prefix):]
            return f"--plan {path}{' ' if prefix.endswith(' ') and not prefix.endswith(': ') else ': '}{rest}"
    return f"--plan {path}: {text}"


def _is_cost_file(name: str) -> bool:
    return Path(name).is_file()


def step_memory_floor_bytes(model: str, batch_size: int, model_kwargs: dict[str, Any] | None = None) -> int:
    """A lower bound in bytes of one training step's memory on a rank, from the catalogue alone: the
    inputs, a sequence model's float32 logits, and BERT's attention scores; catches a batch no machine
    could hold."""
    info = model_info(model)
    kw = model_kwargs or {}
    if info.family == "vision":
        per_sample = 4 * math.prod(info.input_size)
    else:
        seq = int(kw.get("seq_len") or info.input_size[0])
        vocab = int(kw.get("num_classes") or info.num_classes)
        per_sample = 8 * seq + 4 * seq * vocab + (4 * seq * seq if info.family == "bert" else 0)
    return int(batch_size) * per_sample


def check_step_memory(need_per_rank: float, ranks: int, what: str) -> None:
    """ValueError naming ``what`` unless ``ranks`` local ranks, each needing ``need_per_rank`` bytes, fit
    the available memory less each rank's footprint (unknown memory: no check)."""
    from repro.launch.local import RANK_MEMORY_BYTES, available_memory_bytes

    avail = available_memory_bytes()
    if avail is None:
        return
    room = max(0, avail - ranks * RANK_MEMORY_BYTES)
    if ranks * need_per_rank > room:
        raise ValueError(f"{what} needs at least {need_per_rank / 2**30:.3g} GiB per step on each of {ranks} rank(s) "
                         f"(inputs and outputs alone), but about {room / 2**30:.1f} GiB are available "
                         f"({avail / 2**30:.1f} GiB less {ranks} x {RANK_MEMORY_BYTES // 2**20} MiB per rank)")


class _Parser(argparse.ArgumentParser):
    """Bad arguments raise ValueError (one line: ``repro: error: train: ...``), never a usage block."""

    def error(self, message: str):
        raise ValueError(f"train: {message}")


def build_parser(*, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """``repro train``'s parser; ``suppress_defaults``: a flag not given is absent from the namespace (what
    :func:`given_flags` reads)."""
    p = _Parser(prog="repro train", description="Train one model with one scheduler (per rank; run under "
                "torchrun or `repro launch`).", formatter_class=DefaultsHelpFormatter)
    for f in fields(TrainConfig):  # the fields' defaults, not TrainConfig(): its checks import the datasets
        if not f.metadata.get("cli", True):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kw: dict[str, Any] = {"default": default, "help": f.metadata.get("help", "")}
        if "choices" in f.metadata:
            kw["choices"] = list(f.metadata["choices"])
        kind = f.metadata.get("kind")
        if kind is bool or (isinstance(default, bool) and default):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, bool):
            kw["action"] = "store_true"
        else:
            kw["type"] = kind if kind is not None else str if default is None else type(default)
        p.add_argument(flag, **kw)
    p.add_argument("--seq-len", type=int, help="sequence length of the BERT and LSTM models (positive; default: "
                                               "the model's)")
    p.add_argument("--backend", choices=["gloo", "nccl"], help="force a backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--pg-timeout-s", type=float, default=300.0, help="process-group timeout, seconds")
    p.add_argument("--join-timeout-s", type=float, default=120.0,
                   help="seconds to wait for every rank to arrive before joining the process group (under torchrun); a "
                        "rank that fails before joining ends the wait at once")
    if suppress_defaults:
        for action in p._actions:
            action.default = argparse.SUPPRESS
    return p


def given_flags(argv: Sequence[str]) -> set[str]:
    """The destinations (``batch_size``, ``threshold_bytes``...) of the flags ``argv`` gives, whatever their
    value (a default given explicitly counts): what the user asked for, as opposed to what was defaulted."""
    return set(vars(build_parser(suppress_defaults=True).parse_args(list(argv))))


def config_from_argv(argv: Sequence[str], **overrides: Any) -> tuple[TrainConfig, argparse.Namespace]:
    """Parse ``repro train`` arguments into a config (ValueError on bad input); ``overrides`` set fields
    that are not command-line options (e.g. ``emulated_bandwidth_bps``)."""
    args = build_parser().parse_args(list(argv))
    given = given_flags(argv)
    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.metadata.get("cli", True)}
    if args.seq_len is not None:
        if args.seq_len < 1:
            raise ValueError(f"--seq-len must be a positive number of tokens, got {args.seq_len}")
        ranges.check(ranges.SEQ_LEN, args.seq_len, "--seq-len", what="option")
        kw["model_kwargs"] = {"seq_len": args.seq_len}
    kw.update(overrides)
    if args.backend == "nccl" and kw.get("device") == "cpu":
        raise ValueError("--device cpu does not go with --backend nccl, which communicates CUDA tensors only; use "
                         "--backend gloo (or leave it out)")
    for flag, value in (("--pg-timeout-s", args.pg_timeout_s), ("--join-timeout-s", args.join_timeout_s)):
        if not (isinstance(value, float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a finite positive number of seconds, got {value}")
        ranges.check(ranges.SECONDS, value, flag, what="option")
    cfg = TrainConfig(**kw)
    _check_given(cfg, args, given)
    return cfg, args


def _check_given(cfg: TrainConfig, args: argparse.Namespace, given: set[str]) -> None:
    """Refuse what the user gave that the run would not use: a run option the scheduler does not take, a
    ``--scheduler`` other than ``--plan``'s, ``--fit-repeats`` where no cost model is fitted."""
    if cfg.plan is not None and "scheduler" in given and get_scheduler(args.scheduler).name != cfg.scheduler:
        raise ValueError(f"--scheduler {args.scheduler} disagrees with --plan {cfg.plan}, which '{cfg.scheduler}' "
                         f"runs; leave --scheduler out (the plan says who runs it) or give --scheduler "
                         f"{cfg.scheduler}")
    refuse_given_options(sorted(given & set(RUN_OPTIONS)), get_scheduler(cfg.scheduler))
    if "fit_repeats" in given:
        if cfg.plan is not None:
            raise ValueError(f"--fit-repeats does not apply with --plan {cfg.plan}: a plan is run as it is, without "
                             "a cost fit; leave --fit-repeats out")
        if not get_scheduler(cfg.scheduler).has_plan:
            raise ValueError(f"--fit-repeats does not apply to --scheduler {cfg.scheduler}, which fits no cost model")


