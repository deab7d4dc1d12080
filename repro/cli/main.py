"""Command line: ``repro {profile,plan,simulate,compare,grid,cost,train,launch,calibrate,schedulers,presets,models,traces}`` (also ``python -m repro``).

JSON in and out (the listings print a table unless ``--format json``). Bad input ends with exit status 2 and one line on stderr, ``repro: error: ...``, naming
the problem, before any work (outputs are checked to be writable first, and written atomically).
Ctrl-C ends with status 130 and one line; a closed pipe (``repro presets | head``) ends quietly.
``-v``/``-q`` before the subcommand set how much the package logs (see :mod:`repro.log`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from repro.core.text import DefaultsHelpFormatter, text_table as _table
from repro.core.outputs import check_output, read_input, release_outputs, write_output
from repro.core import ranges
from repro.core.cost import CostModel, CostModelError
from repro.costs.presets import PRESETS, preset_names, preset_workers
from repro.core.plan import WIRE_DTYPE_BYTES, Plan, PlanError
from repro.core.trace import TraceError, load_trace

__all__ = ["main", "build_parser"]


class UsageError(Exception):
    """Bad command-line input; printed as one line."""


class _Parser(argparse.ArgumentParser):
    """One line instead of usage + message; defaults shown in ``--help`` (where there is one)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        sub = self.prog[len("repro "):] if self.prog.startswith("repro ") else ""
        raise UsageError(f"{sub}: {message}" if sub else message)


def _add_cost_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("communication cost (choose one source: --alpha-s/--beta-s-per-byte, --network, "
                             "--cost, or a cluster: --inter-link and/or --intra-link)")
    g.add_argument("--alpha-s", type=float, help="all-reduce start-up A, seconds: a message of b bytes costs "
                                                 "A + B*b s")
    g.add_argument("--beta-s-per-byte", type=float, help="all-reduce seconds per byte B")
    g.add_argument("--network", metavar="PRESET|FILE",
                   help=f"network preset (published fits, and *-calibrated: a hierarchical cluster with realism "
                        f"fitted to published measurements): {', '.join(preset_names())} (`repro presets`), or a "
                        f"CostModel JSON file")
    g.add_argument("--cost", metavar="FILE|PRESET",
                   help="a CostModel JSON file (as written by `repro calibrate` or `repro cost fit`), or a preset name")
    g.add_argument("--workers", type=int, help="number of workers P (a preset needs it or --nodes/--gpus-per-node; "
                                               "with a file it must match the file's P; with a cluster: default "
                                               "every device)")
    c = p.add_argument_group("your cluster (a cost line for every collective of every family)")
    c.add_argument("--nodes", type=int, help="nodes N; P = N x --gpus-per-node unless --workers says otherwise")
    c.add_argument("--gpus-per-node", type=int, help="devices per node G (default 1)")
    c.add_argument("--inter-link", metavar="RATE[@LATENCY]",
                   help="the network between nodes, e.g. 25gbit, 100mbit@50us, 10GB/s@0.5ms (latency default "
                        "25us)")
    c.add_argument("--intra-link", metavar="RATE[@LATENCY]",
                   help="the link between devices of a node, e.g. 300GB/s@3us (latency default 5us; without it: "
                        "the intra-node link fitted on the measured V100 cluster, preset 10gbe-calibrated)")
    c.add_argument("--algorithm", help="collective algorithm across the cluster: ring (default: one ring over "
                                       "every device), hierarchical (intra-node reduce-scatter, ring across "
                                       "nodes, intra-node all-gather), tree, recursive_doubling, halving_doubling")
    t = p.add_argument_group("top-k cost of the sparse family (gamma d log2 d seconds on d elements)")
    t.add_argument("--topk-gamma", type=float, metavar="S", help="gamma in seconds (default: the cost model's, "
                                                                 "else the trace's GPU in the device table)")
    t.add_argument("--topk-device", metavar="GPU", help="gamma of this GPU from the device table: OMGS-SGD's "
                                                        "P102-100 fit scaled by memory bandwidth (K80, P100, V100, "
                                                        "A100, H100, P102)")


# -o is kept as typed (no type=Path: a Path would drop the trailing separator that says a folder was named).
#: ``-o`` values that mean this process's standard output: written to it directly (a pipe, a terminal or a file
#: the shell opened), never replaced by a file (``/dev/stdout`` on a pipe links to no path a file could replace)
STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")

#: the flags of file inputs (attribute, flag): ``-o`` may not name one of them
_INPUT_FLAGS = (("trace", "--trace"), ("plan", "--plan"), ("network", "--network"), ("cost", "--cost"),
                ("measurements", "the measurements file"))


def _is_stdout(path: str | Path | None) -> bool:
    return path is not None and (str(path) == "-" or os.path.abspath(str(path)) in STDOUT_NAMES[1:])


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.isfile(a) and os.path.isfile(b) and os.path.samefile(a, b)
    except OSError:
        return False


def _check_output(path: str | Path | None, args: argparse.Namespace | None = None, *, stdout: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written without harm (:mod:`repro.core.outputs`) or
    that is the same file as an input of ``args``. ``-`` and ``/dev/stdout`` (:data:`STDOUT_NAMES`) are
    allowed only for a command whose only output is that text (``stdout``)."""
    if path is None:
        return
    if _is_stdout(path):
        if not stdout:
            raise UsageError(f"-o {path}: this command prints its summary on standard output, so its file cannot "
                             "go there too; give a file name")
        return
    for attr, flag in _INPUT_FLAGS if args is not None else ():
        given = getattr(args, attr, None)
        if given is not None and _same_file(path, given):
            raise UsageError(f"-o {path} is the same file as {flag} {given}: writing it would destroy the input; "
                             "give another output file")
    check_output(path)  # an OutputPathError is a ValueError: one line, as a UsageError


def _write_atomically(path: str | Path | None, text: str) -> None:
    """``text`` to the file ``path``, atomically; to standard output without ``-o`` (None) or for ``-`` and
    :data:`STDOUT_NAMES`, written into the stream as it is (a pipe, a terminal, a file the shell opened)."""
    if path is None or _is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_output(path, text)


def _positive_flag(flag: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be a positive integer, got {value}")
    return value


def _flag_in_range(flag: str, quantity, value, low: float | None = None):
    """``value`` of ``flag`` if it lies in ``quantity``'s plausible range (:mod:`repro.core.ranges`),
    the range its file is read back with; else one :class:`UsageError` line."""
    if value is None:
        return None
    return ranges.check(quantity, value, flag, UsageError, low=low, what="flag")


def _check_cost_flag_ranges(args: argparse.Namespace) -> None:
    """The cost flags within the ranges their files are read with."""
    _flag_in_range("--alpha-s", ranges.SECONDS, args.alpha_s)
    _flag_in_range("--beta-s-per-byte", ranges.SECONDS_PER_BYTE, args.beta_s_per_byte)
    if args.workers is not None and args.workers >= 2:  # below 2: the message of _cost_from_args
        _flag_in_range("--workers", ranges.WORKERS, args.workers, low=2)
    for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value >= 1:  # below 1: _positive_flag's message
            _flag_in_range(flag, ranges.WORKERS, value)
    if args.nodes is not None and args.gpus_per_node is not None and \
            args.nodes * args.gpus_per_node > ranges.WORKERS.high:
        raise UsageError(f"--nodes {args.nodes} x --gpus-per-node {args.gpus_per_node} = "
                         f"{args.nodes * args.gpus_per_node} devices is outside the plausible range "
                         f"{ranges.WORKERS.range_text()}")
    if args.topk_gamma is not None and args.topk_gamma >= 0:  # negative: the message below
        _flag_in_range("--topk-gamma", ranges.TOPK_GAMMA_S, args.topk_gamma)


def _cost_from_args(args: argparse.Namespace, trace=None) -> CostModel:
    """The cost model of the cost flags (exactly one source), with a top-k cost from ``--topk-gamma``,
    ``--topk-device``, the model itself, or ``trace``'s GPU."""
    from repro.costs.cluster_cost import (
        CLUSTER_ALGORITHMS, DEFAULT_INTER_LATENCY_S, DEFAULT_INTRA_LATENCY_S, cluster_cost_model,
        load_cost, parse_link, topk_device_of_trace, topk_gamma_for_device)

    cluster = args.inter_link is not None or args.intra_link is not None
    sources = [args.alpha_s is not None or args.beta_s_per_byte is not None, args.network is not None,
               args.cost is not None, cluster]
    _check_cost_flag_ranges(args)
    if sum(sources) != 1:
        raise UsageError("give exactly one cost source: --alpha-s A --beta-s-per-byte B, "
                         "--network PRESET|FILE, --cost FILE|PRESET, or a cluster (--nodes N --gpus-per-node G "
                         "--inter-link RATE[@LATENCY])")
    if args.algorithm is not None and not cluster:
        raise UsageError("--algorithm applies to a cluster given by --inter-link / --intra-link")
    if args.algorithm is not None and args.algorithm not in CLUSTER_ALGORITHMS:
        raise UsageError(f"--algorithm: unknown algorithm {args.algorithm!r}; choose one of "
                         f"{', '.join(CLUSTER_ALGORITHMS)}")
    nodes = _positive_flag("--nodes", args.nodes)
    gpus = _positive_flag("--gpus-per-node", args.gpus_per_node)
    workers = args.workers
    if workers is not None and workers < 2:
        raise UsageError(f"--workers must be an integer >= 2, got {workers}")
    if cluster:
        if nodes is None:
            raise UsageError("a cluster needs --nodes N (and --gpus-per-node G, default 1)")
        inter = None if args.inter_link is None else parse_link(args.inter_link, "--inter-link",
                                                                  DEFAULT_INTER_LATENCY_S)
        intra = None if args.intra_link is None else parse_link(args.intra_link, "--intra-link",
                                                                  DEFAULT_INTRA_LATENCY_S)
        cost = cluster_cost_model(nodes, gpus or 1, inter, intra, args.algorithm or "ring", workers)
    else:
        if nodes is not None or gpus is not None:
            devices = (nodes or 1) * (gpus or 1)
            if workers is not None and workers != devices:
                raise UsageError(f"--workers {workers} contradicts --nodes {nodes or 1} x --gpus-per-node {gpus or 1}"
                                 f" = {devices} workers; give one of them")
            workers = devices
        if args.network is not None:
            cost = load_cost(args.network, workers, "--network")
        elif args.cost is not None:
            cost = load_cost(args.cost, workers, "--cost")
        elif args.alpha_s is None or args.beta_s_per_byte is None:
            raise UsageError("--alpha-s and --beta-s-per-byte must be given together")
        else:
            cost = CostModel.linear(workers or 2, args.alpha_s, args.beta_s_per_byte, source="cli alpha-beta")
    gamma, source = _topk_from_flags(args)
    if source is None and cost.topk_gamma_s is None and trace is not None and topk_device_of_trace(trace) is not None:
        gamma, source = topk_gamma_for_device(topk_device_of_trace(trace))
        source += f", the GPU of trace {trace.model}"
    if source is not None:
        cost = replace(cost.with_topk(gamma), meta={**cost.meta, "topk_source": source})
    return cost


def _topk_from_flags(args: argparse.Namespace) -> tuple[float | None, str | None]:
    """(gamma seconds, where it comes from) of ``--topk-gamma`` or ``--topk-device``; (None, None) without."""
    from repro.costs.cluster_cost import topk_gamma_for_device

    if args.topk_gamma is not None and args.topk_device is not None:
        raise UsageError("give one top-k cost: --topk-gamma S or --topk-device GPU")
    if args.topk_gamma is not None:
        g = args.topk_gamma
        if not (g >= 0 and g < float("inf")):
            raise UsageError(f"--topk-gamma must be a finite non-negative number of seconds, got {g}")
        return g, f"top-k gamma {g:g} s (--topk-gamma)"
    if args.topk_device is not None:
        return topk_gamma_for_device(args.topk_device)
    return None, None


def _emit(obj: object, out: str | Path | None) -> None:
    try:
        text = json.dumps(obj, indent=1, allow_nan=False)
    except ValueError:
        raise UsageError("the result holds a non-finite number (NaN or infinity); check the inputs' times "
                         "and costs") from None
    _write_atomically(out, text + "\n")


def _parse_input_shape(text: str) -> tuple[int, ...]:
    """``--input-shape C,H,W`` (any number of positive integers) as a tuple."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(n < 1 for n in shape):
        raise UsageError(f"--input-shape must be positive integers separated by commas (one sample's shape, e.g. "
                         f"3,32,32), got {text!r}")
    if math.prod(shape) > ranges.ELEMENTS.high:  # one sample: at most as many elements as a tensor may have
        raise UsageError(f"--input-shape {text} has {ranges.show(math.prod(shape))} elements per sample, outside the "
                         f"plausible range {ranges.ELEMENTS.range_text(1)}")
    return shape


def _load_factory_model(ref: str):
    """Import ``package.module`` (the current folder first, as ``python -m``), walk ``factory``'s dotted
    attributes, call it with no arguments and return the ``torch.nn.Module``; anything wrong is one line."""
    module_name, colon, attr = ref.partition(":")
    if not colon:
        raise UsageError(f"--model {ref}: not a model name, and a model of your own is written "
                         "package.module:factory, with a colon (e.g. mymodels:build_net); `repro models` lists "
                         "the names")
    if not (all(p.isidentifier() for p in module_name.split("."))
            and all(p.isidentifier() for p in attr.split("."))):
        raise UsageError(f"--model {ref}: write a model of your own as package.module:factory (dotted Python "
                         "names, one colon between the module and the factory)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UsageError(f"--model {ref}: no module named {e.name!r} (searched the current folder and "
                             "sys.path; install it or set PYTHONPATH)") from None
        raise UsageError(f"--model {ref}: importing {module_name!r} failed: ModuleNotFoundError: "
                         f"{_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the user's module: whatever it raises is one line
        raise UsageError(f"--model {ref}: importing {module_name!r} failed: {type(e).__name__}: "
                         f"{_first_line(e)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--model {ref}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    from torch import nn

    if isinstance(obj, nn.Module):
        raise UsageError(f"--model {ref}: {attr} is a model instance, not a factory; give the function or class "
                         "that builds it (called with no arguments)")
    if not callable(obj):
        raise UsageError(f"--model {ref}: {attr} is not callable (type {type(obj).__name__}); the factory is called "
                         "with no arguments and returns a torch.nn.Module")
    try:
        model = obj()
    except Exception as e:  # noqa: BLE001 - the user's factory: whatever it raises is one line
        raise UsageError(f"--model {ref}: calling {attr}() failed: {type(e).__name__}: {_first_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model {ref}: {attr}() returned type {type(model).__name__}, not a torch.nn.Module")
    return model


def _factory_batch(args: argparse.Namespace, model, shape: tuple[int, ...]):
    """A factory model's example batch (moved to ``--device``): standard-normal inputs ``(batch, *shape)`` and
    class targets in [0, classes), seed 0; a model that does not return ``(batch, classes)`` logits is
    refused."""
    import torch

    from repro.workload.profile import _check_device

    dev = _check_device(args.device)  # CUDA that is not there: one line, before any work
    model.to(dev)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((args.batch_size, *shape), generator=gen)
    try:
        with torch.no_grad():
            out = model(x.to(dev))
    except Exception as e:  # noqa: BLE001 - the user's model: whatever it raises is one line
        raise UsageError(f"--model {args.model}: a forward pass on inputs of shape {tuple(x.shape)} (--batch-size, "
                         f"--input-shape) failed: {type(e).__name__}: {_first_line(e)}") from None
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == args.batch_size
            and out.is_floating_point()):
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise UsageError(f"--model {args.model}: its output is {got}, but profile trains a model of your own with "
                         f"cross-entropy on (batch, classes) logits, here ({args.batch_size}, classes); for another "
                         "output or loss use repro.workload.profile.profile_model(module, batch=..., loss_fn=...) in Python")
    classes = args.num_classes if args.num_classes is not None else int(out.shape[1])
    if classes > out.shape[1]:
        raise UsageError(f"--num-classes {classes} is more than the model's {out.shape[1]} outputs per sample")
    y = torch.randint(0, classes, (args.batch_size,), generator=gen)
    return x, y, classes


def cmd_profile(args: argparse.Namespace) -> None:
    """Profile a registry model, or a model of your own (``--model package.module:factory``)."""
    from repro.training.config import check_step_memory, step_memory_floor_bytes

    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    ranges.check(ranges.BATCH_SIZE, args.batch_size, "--batch-size", UsageError, what="option")
    if not (0 <= args.warmup <= 1000 and 1 <= args.iters <= 10000):
        raise UsageError(f"--warmup must be in [0, 1000] and --iters in [1, 10000], got {args.warmup} and "
                         f"{args.iters}")
    own = ":" in args.model or "." in args.model  # package.module:factory (registry names have neither)
    if own:
        if args.input_shape is None:
            raise UsageError(f"--model {args.model} (a model of your own) needs --input-shape, one sample's shape, "
                             "e.g. 3,32,32")
        shape = _parse_input_shape(args.input_shape)
        if args.num_classes is not None and args.num_classes < 1:
            raise UsageError(f"--num-classes must be positive, got {args.num_classes}")
        if args.num_classes is not None:
            ranges.check(ranges.CLASSES, args.num_classes, "--num-classes", UsageError, what="option")
        if args.device == "cpu":  # the float32 input batch alone
            check_step_memory(4 * args.batch_size * math.prod(shape), 1,
                              f"--batch-size {args.batch_size} --input-shape {args.input_shape}")
        if args.estimate_gpu:
            raise UsageError("--estimate-gpu estimates registry models only (`repro models`); measure a model of "
                             "your own on this machine's --device")
        module = _load_factory_model(args.model)  # a bad reference fails now, before any work
    else:
        from repro.workload.models import get_spec

        try:
            get_spec(args.model)  # an unknown model fails now, before any work
        except ValueError as e:
            raise UsageError(f"{_first_line(e)}; or a model of your own as package.module:factory") from None
        if args.device == "cpu" and not args.estimate_gpu:  # a batch this machine cannot hold: one line now
            check_step_memory(step_memory_floor_bytes(args.model, args.batch_size), 1,
                              f"--model {args.model} --batch-size {args.batch_size}")
        for flag, value in (("--input-shape", args.input_shape), ("--num-classes", args.num_classes)):
            if value is not None:
                raise UsageError(f"{flag} is for a model of your own (--model package.module:factory); registry "
                                 f"model {args.model!r} makes its own inputs")
    if args.estimate_gpu:
        from repro.workload.estimate import get_gpu

        get_gpu(args.estimate_gpu)
        if args.autocast is not None:
            raise UsageError("--autocast is for measuring; the estimate's precision is its dtype (fp32 here; "
                             "repro.workload.estimate.estimate_trace(dtype='float16') in Python)")
    _check_output(args.output)
    if args.estimate_gpu:  # (a registry model: checked above)
        from repro.workload.estimate import estimate_trace

        trace = estimate_trace(args.model, args.batch_size, gpu=args.estimate_gpu, view=args.view)
    else:
        from repro.workload.profile import profile_model

        measure = dict(device=args.device, view=args.view, warmup=args.warmup, iters=args.iters,
                       autocast=args.autocast)
        if own:
            x, y, classes = _factory_batch(args, module, shape)
            import torch.nn.functional as F

            trace = profile_model(module, batch=(x, y), loss_fn=F.cross_entropy, **measure)
            trace.extra.update({"factory": args.model, "input_shape": list(shape), "num_classes": classes,
                                "loss": "cross_entropy"})
        else:
            trace = profile_model(args.model, args.batch_size, **measure)
    _write_atomically(args.output, trace.to_json() + "\n")
    print(json.dumps({"output": str(args.output), "model": trace.model, "device": trace.device,
                      "layers": trace.num_layers, "forward_s": trace.total_forward_s,
                      "backward_s": trace.total_backward_s}))


def cmd_plan(args: argparse.Namespace) -> None:
    from repro.core.planners import PLANNERS, make_plan

    _check_output(args.output, args, stdout=True)
    given = {"threshold_bytes": args.threshold_bytes, "wire_dtype": args.wire_dtype,  # wire dtype: the planner
             "density": args.density, "pack": True if args.pack else None,              # solves on those bytes
             "topk_scope": args.topk_scope,
             "servers": args.servers, "staleness": args.staleness, "stage1_share": args.stage1_share,
             "importance": args.importance, "lgp": False if args.no_lgp else None}
    options = {k: v for k, v in given.items() if v is not None}
    for name in options:
        takers = [n for n, fn in PLANNERS.items() if name in inspect.signature(fn).parameters]
        if args.solver not in takers:
            flag = "--no-lgp" if name == "lgp" else "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply to --solver {args.solver} (it applies to: {', '.join(takers)})")
    trace = load_trace(args.trace)
    cost = _cost_from_args(args, trace)
    plan = make_plan(args.solver, trace, cost, **options)
    out = {"solver": plan.solver, "iteration_s": plan.meta["iteration_s"],
           "buckets": plan.to_dict()["buckets"]}  # a bucket that is not one all-reduce keeps its messages
    out.update({k: v for k, v in plan.to_dict().items() if k not in out})
    try:  # what `repro simulate --plan` and `repro train --plan` will read: refused now, not there
        Plan.from_dict(json.loads(json.dumps(out)))
    except (PlanError, ValueError) as e:
        raise UsageError(f"the plan would not load back ({_first_line(e)}); check the cost flags "
                         "(--alpha-s, --beta-s-per-byte, --network, --cost)") from None
    _emit(out, args.output)


def cmd_simulate(args: argparse.Namespace) -> None:
    from repro.core.simulate import simulate

    _check_output(args.output, args, stdout=True)
    trace = load_trace(args.trace)
    plan = read_input("plan", args.plan, Plan.load)  # every error names the file
    try:
        plan.groups(trace)  # the plan's layers are the trace's: else one line naming both files
    except PlanError as e:
        raise UsageError(f"{args.plan}: {e}; the trace is {args.trace}") from None
    cost = _cost_from_args(args, trace)
    try:
        result = simulate(trace, plan, cost, with_ops=not args.no_ops)
    except PlanError as e:  # the family's own checks of the plan against the trace and cost
        raise UsageError(f"{args.plan}: {e} (trace {args.trace})") from None
    ranges.check(ranges.SECONDS, result.iteration_s, "iteration_s", UsageError, what="predicted")
    _emit(result.to_dict(with_ops=not args.no_ops), args.output)


def _compare_cost(args: argparse.Namespace) -> CostModel:
    """``repro compare``'s cost model: a preset name mapped by ``--cost-mode``
    (:func:`repro.cli.compare.network_cost`), any other source as given."""
    from repro.cli.compare import network_cost

    cost = _cost_from_args(args, None)
    name = args.network if args.network is not None else args.cost
    if args.cost_mode == "paper" or name is None or name not in PRESETS or Path(name).is_file():
        return cost
    try:
        mapped = network_cost(name, cost.workers, args.cost_mode)
    except (CostModelError, ValueError) as e:
        raise UsageError(f"--cost-mode {args.cost_mode}: {str(e).splitlines()[0]} (--cost-mode paper: the preset's "
                         "published lines)") from None
    if args.topk_gamma is not None or args.topk_device is not None:
        mapped = replace(mapped.with_topk(cost.topk_gamma_s), meta={**mapped.meta, "topk_source":
                                                                    cost.meta.get("topk_source")})
    return mapped


def cmd_compare(args: argparse.Namespace) -> None:
    """Every scheduler's predicted iteration on one trace and cost model (:mod:`repro.cli.compare`)."""
    from repro.cli.compare import compare, format_csv, format_table, with_topk
    from repro.core.budget import check_time_budget

    _check_output(args.output, args, stdout=True)
    try:
        budget = check_time_budget(args.time_budget_s)
    except ValueError:
        raise UsageError(f"--time-budget-s must be a finite positive number of seconds, got {args.time_budget_s:g}") \
            from None
    if args.density is not None and not 0 < args.density <= 1:
        raise UsageError(f"--density must be a number in (0, 1], got {args.density:g}")
    if args.servers is not None and args.servers < 1:
        raise UsageError(f"--servers must be a positive integer, got {args.servers}")
    names = None if args.schedulers is None else [n.strip() for n in args.schedulers.split(",") if n.strip()]
    if names == []:  # "", ",", " , ": before the trace and cost are read
        from repro.core.schedulers import SCHEDULERS

        raise UsageError(f"--schedulers {args.schedulers!r} names no scheduler; give one or more of "
                         f"{', '.join(SCHEDULERS)} separated by commas, or leave --schedulers out for every one")
    trace = load_trace(args.trace)
    cost = _compare_cost(args)
    servers = args.servers
    if servers is None and args.nodes is not None and "cluster" not in cost.meta:  # a preset or file on N nodes
        servers = args.nodes
    records = compare(trace, cost, servers=servers, time_budget_s=budget,
                      options={"density": args.density}, schedulers=names)
    if args.format == "json":
        _emit(records, args.output)
        return
    if args.format == "csv":
        text = format_csv(records)
    else:
        cost = with_topk(cost)  # the top-k cost compare used
        header = [f"trace {args.trace}: {trace.model}, batch {trace.batch_size}, {trace.device}",
                  f"P={cost.workers}, cost: {cost.source}",
                  str(cost.meta.get("topk_source", f"top-k gamma {cost.topk_gamma_s:g} s"))]
        text = format_table(records, header)
    _write_atomically(args.output, text + "\n")


def cmd_cost_fit(args: argparse.Namespace) -> None:
    """Fit a cost file to a user's measured collectives (:func:`repro.costs.cluster_cost.fit_measurements_csv`)."""
    from repro.costs.cluster_cost import fit_measurements_csv

    if args.workers is not None and args.workers < 2:
        raise UsageError(f"--workers must be an integer >= 2, got {args.workers}")
    _check_output(args.output, args, stdout=True)
    cost = fit_measurements_csv(args.measurements, args.workers)
    _emit(cost.to_dict(), args.output)


def cmd_cost_cluster(args: argparse.Namespace) -> None:
    """Write a cluster file (:class:`repro.costs.cluster_cost.ClusterDescription`): a cost model for any P."""
    from repro.costs.cluster_cost import (
        DEFAULT_INTER_LATENCY_S, DEFAULT_INTRA_LATENCY_S, ClusterDescription, parse_link)

    _positive_flag("--gpus-per-node", args.gpus_per_node)
    _flag_in_range("--gpus-per-node", ranges.WORKERS, args.gpus_per_node)
    if args.topk_gamma is not None and args.topk_gamma >= 0:
        _flag_in_range("--topk-gamma", ranges.TOPK_GAMMA_S, args.topk_gamma)
    if args.topk_gamma is not None and args.topk_device is not None:
        raise UsageError("give one top-k cost: --topk-gamma S or --topk-device GPU")
    _check_output(args.output, stdout=True)
    gamma, source = _topk_from_flags(args)
    cluster = ClusterDescription(
        gpus_per_node=args.gpus_per_node, inter=parse_link(args.inter_link, "--inter-link", DEFAULT_INTER_LATENCY_S),
        intra=None if args.intra_link is None else parse_link(args.intra_link, "--intra-link", DEFAULT_INTRA_LATENCY_S),
        algorithm=args.algorithm, topk_gamma_s=gamma, topk_source=source, name=args.name or "")
    for p in (2, args.gpus_per_node, 2 * args.gpus_per_node):  # a description no P can use fails here
        if p >= 2:
            cluster.cost_model(p)
    # what --cost / --network and the notebooks' presets will read: refused now, not there
    ClusterDescription.from_dict(json.loads(cluster.to_json()), "the cluster file to write")
    _emit(cluster.to_dict(), args.output)


def _add_local_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, required=True,
                   help="ranks to start on this machine (at most what its memory and process limit allow)")
    p.add_argument("--emulate-bandwidth", help="run each rank in its own network namespace with links shaped "
                                               "to this rate, e.g. 100mbit, 1gbit (needs root and tc)")
    p.add_argument("--timeout-s", type=float, default=3600.0,
                   help="give up (and kill the ranks) after this many seconds (finite, positive)")


def _check_local_flags(args: argparse.Namespace) -> None:
    """``--nproc`` within :func:`repro.launch.local.max_local_ranks` and ``--timeout-s`` in its plausible
    range, before anything else."""
    from repro.launch.local import max_local_ranks

    if args.nproc is not None and args.nproc >= 1 and not getattr(args, "torchrun", False):
        limit, why = max_local_ranks()  # below 1: the commands' own words
        if args.nproc > limit:
            raise UsageError(f"--nproc {args.nproc} is more than this machine can run: at most {limit} ranks ({why})")
    if math.isfinite(args.timeout_s) and args.timeout_s > 0:
        ranges.check(ranges.SECONDS, args.timeout_s, "--timeout-s", UsageError, what="option")


def _launch(args: argparse.Namespace, fn, fn_args: tuple, *, backend: str | None = "gloo",
            pg_timeout_s: float | None = None, serving: int = 0):
    """Rank 0's result of ``fn(ctx, *fn_args)`` on ``--nproc`` local ranks; the first ``serving`` ranks have
    role ``server``, the others ``worker``."""
    from repro.launch.local import Role, launch_local

    if args.nproc < 1:
        raise UsageError(f"--nproc must be positive, got {args.nproc}")
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise UsageError(f"--timeout-s must be a finite positive number of seconds, got {args.timeout_s:g}")
    options = {} if pg_timeout_s is None else {"pg_timeout_s": pg_timeout_s}
    if serving and 0 < serving < args.nproc:
        target = {"roles": [Role("server", fn, serving, args=fn_args), Role("worker", fn, args.nproc - serving,
                                                                             args=fn_args)]}
    else:
        target = {"fn": fn, "world_size": args.nproc, "args": fn_args}
    try:
        return launch_local(timeout_s=args.timeout_s, backend=backend, emulate_bandwidth=args.emulate_bandwidth,
                            quiet=True, **target, **options)[0]
    except ValueError as e:
        if str(e).startswith(f"world_size {args.nproc} "):  # the launcher's bound, in this command's terms
            raise UsageError(f"--nproc {str(e)[len('world_size '):]}") from None
        raise


def cmd_launch(args: argparse.Namespace) -> None:
    """Train on ``--nproc`` local ranks (gloo unless the train args say ``--backend nccl``); every check of
    the train args, devices and memory is made before any rank starts."""
    from repro.training.config import config_from_argv

    _check_local_flags(args)
    train_args = [a for a in args.train_args if a != "--"] if args.train_args[:1] == ["--"] else args.train_args
    overrides = {}
    if args.emulate_bandwidth:  # the rate travels in the run's config (run.json), not in the environment
        from repro.launch.netns import parse_bandwidth

        overrides["emulated_bandwidth_bps"] = float(parse_bandwidth(args.emulate_bandwidth, "--emulate-bandwidth",
                                                                    emulated=True))
    cfg, train = config_from_argv(train_args, **overrides)  # bad arguments fail here, before any rank starts
    if not (math.isfinite(train.pg_timeout_s) and train.pg_timeout_s > 0):
        raise UsageError(f"--pg-timeout-s must be a finite positive number of seconds, got {train.pg_timeout_s:g}")
    if args.nproc >= 1:
        cfg.check_world(args.nproc, backend=train.backend)  # e.g. an online planner on one rank, servers on nccl
    cfg.check_plan_layers(args.nproc if args.nproc >= 1 else None)  # another model's or P's plan: here, not in the ranks
    if args.nproc >= 1 and cfg.device != "cuda":  # a batch no rank could hold fails here, not in an allocator
        from repro.training.config import step_memory_floor_bytes, check_step_memory

        check_step_memory(step_memory_floor_bytes(cfg.model, cfg.batch_size, cfg.model_kwargs), args.nproc,
                          f"--model {cfg.model} --batch-size {cfg.batch_size}"
                          + (f" --seq-len {cfg.model_kwargs['seq_len']}" if "seq_len" in cfg.model_kwargs else ""))
    if cfg.device == "cuda":  # checked here, before any rank starts (nccl's own check is launch_local's)
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda, but CUDA is not available on this machine (torch.cuda.is_available() "
                             "is False); use --device cpu")
        if args.nproc > torch.cuda.device_count():
            raise UsageError(f"--device cuda trains each rank on its own GPU, but --nproc {args.nproc} ranks were asked "
                             f"for and {torch.cuda.device_count()} GPU(s) are visible")
    if cfg.results_dir:  # a taken id or an unwritable folder fails now, not after training
        from repro.results.runs import check_results_dir, prepare_run

        if cfg.run_id:  # a checkpoint of this run id is its own progress: the run resumes from it
            from repro.training.checkpoint import checkpoint_path

            own = cfg.checkpointing and checkpoint_path(cfg.results_dir, cfg.run_id).is_file()
            prepare_run(cfg.results_dir, cfg.run_id, cfg.overwrite, own_progress=own)
        else:
            check_results_dir(cfg.results_dir)
    from repro.train import worker_from_argv

    # While rank 0's progress bar is open a file says so: a run that fails or is interrupted there (a killed
    # rank cannot end its line) gets the bar's line ended before the error line.
    marks = tempfile.mkdtemp(prefix="repro-launch-")
    mark = os.path.join(marks, "progress-bar-open")
    try:
        summary = _launch(args, worker_from_argv, (train_args, overrides, None if cfg.quiet else mark),
                          backend=train.backend or "gloo", pg_timeout_s=train.pg_timeout_s,
                          serving=cfg.serving_ranks())
    except BaseException:
        if os.path.exists(mark):
            sys.stderr.write("\n")
            sys.stderr.flush()
        raise
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))


def cmd_calibrate(args: argparse.Namespace) -> None:
    """Fit a cost model on ``--nproc`` local ranks; every bound is checked before any rank starts."""
    from repro.launch.local import RANK_MEMORY_BYTES, available_memory_bytes
    from repro.runtime.calibrate import MEASURABLE, default_sizes_bytes, fit_on_ranks

    _check_local_flags(args)
    kinds = [k.strip() for k in args.collectives.split(",") if k.strip()]
    bad = [k for k in kinds if k not in MEASURABLE]
    if not kinds:
        raise UsageError(f"--collectives {args.collectives!r}: no collective given; choose from {', '.join(MEASURABLE)}")
    if bad:
        raise UsageError(f"unknown collective(s) {bad}; choose from {', '.join(MEASURABLE)}")
    if args.emulate_bandwidth:  # a rate tc cannot shape: one line naming the flag, before any rank starts
        from repro.launch.netns import parse_bandwidth

        parse_bandwidth(args.emulate_bandwidth, "--emulate-bandwidth", emulated=True)
    if args.torchrun:
        if args.nproc is not None or args.emulate_bandwidth:
            raise UsageError("--torchrun joins the ranks torchrun started: leave --nproc and --emulate-bandwidth out")
        if "WORLD_SIZE" not in os.environ:
            raise UsageError("--torchrun: WORLD_SIZE is not set; start this command under torchrun")
        args.nproc = int(os.environ["WORLD_SIZE"])
    elif args.nproc is None:
        raise UsageError("calibrate needs --nproc N (ranks to start here), or --torchrun under torchrun")
    if args.nproc < 2:  # (more than this machine can run: _check_local_flags)
        raise UsageError("calibrate needs --nproc 2 or more")
    if not 2 <= args.sizes <= 64:
        raise UsageError(f"--sizes must be between 2 and 64 (message sizes to fit a line through), got {args.sizes}")
    if not 1 <= args.repeats <= 1000:
        raise UsageError(f"--repeats must be between 1 and 1000, got {args.repeats}")
    for flag, value in (("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        if value < 4:
            raise UsageError(f"{flag} must be at least 4 (one float32 element), got {value}")
    if args.min_bytes > args.max_bytes:
        raise UsageError(f"--min-bytes ({args.min_bytes}) must not exceed --max-bytes ({args.max_bytes})")
    if args.max_bytes < 4 * args.min_bytes:
        raise UsageError(f"--max-bytes ({args.max_bytes}) must be at least 4 x --min-bytes ({4 * args.min_bytes}) "
                         "so that the message sizes span a range to fit a line through")
    factor = {"allreduce": 1.0, "reduce_scatter": 1 + 1 / args.nproc, "allgather": 1 + 1 / args.nproc,
              "sparse_allgather": 1.0 + args.nproc}  # buffers per rank, in units of --max-bytes
    worst = max(kinds, key=factor.__getitem__)
    need = args.nproc * factor[worst] * args.max_bytes
    avail = available_memory_bytes()
    if not args.torchrun and avail is not None and need > avail - args.nproc * RANK_MEMORY_BYTES:
        room = max(0, avail - args.nproc * RANK_MEMORY_BYTES)
        raise UsageError(
            f"--max-bytes {args.max_bytes} needs more memory than is available: about {need / 2**30:.1f} GiB of "
            f"collective buffers on {args.nproc} ranks ({worst}: {factor[worst]:g} x max bytes per rank), but "
            f"about {room / 2**30:.1f} GiB are left ({avail / 2**30:.1f} GiB available less {args.nproc} x "
            f"{RANK_MEMORY_BYTES // 2**20} MiB per rank)")
    _check_output(args.output, stdout=True)
    sizes = default_sizes_bytes(args.max_bytes, args.sizes, args.min_bytes)
    if args.torchrun:  # one rank of a torchrun job: every rank times, rank 0 writes
        from repro.launch.torchrun import distributed

        with distributed(timeout_s=args.timeout_s) as ctx:
            cost = fit_on_ranks(ctx, sizes, kinds, args.repeats)
            if not ctx.is_main:
                return
        _emit(cost, args.output)
        return
    cost = _launch(args, fit_on_ranks, (sizes, kinds, args.repeats))
    if args.emulate_bandwidth:
        cost["meta"]["emulated_bandwidth"] = args.emulate_bandwidth
    _emit(cost, args.output)


def _listing(args: argparse.Namespace, obj: object, table: str) -> None:
    """``--format json``: the object for scripts; ``table`` (the default): ``table`` for a person."""
    if args.format == "json":
        _emit(obj, None)
    else:
        print(table)


def cmd_schedulers(args: argparse.Namespace) -> None:
    from repro.core.families import FAMILIES
    from repro.core.schedulers import ALIASES, schedulers_table

    obj = {"schedulers": schedulers_table(), "aliases": dict(ALIASES),
           "families": {name: f.to_dict() for name, f in FAMILIES.items()}}
    rows = [(name, s["family"] or "(baseline)", s["planner"], ", ".join(s["planner_options"] + s["executor_options"]),
             s["doc"]) for name, s in obj["schedulers"].items()]
    fams = [(name, ", ".join(f["collectives"]), ", ".join(f["phases"]), f["doc"])
            for name, f in obj["families"].items()]
    text = (_table(rows, ("scheduler", "family", "planner", "options", "what it does")) + "\n\n"
            + _table(fams, ("family", "collectives", "phases", "what it does")))
    if obj["aliases"]:
        text += "\n\nold names: " + ", ".join(f"{old} -> {new}" for old, new in obj["aliases"].items())
    _listing(args, obj, text)


def _preset_doc(name: str) -> str:
    if name in PRESETS:
        return PRESETS[name].doc
    from repro.costs.published_fits import calibrated_preset

    cal = calibrated_preset(name)
    t = cal.topology
    return (f"calibrated: {t.devices_per_node} devices per node, {cal.algorithm} all-reduce, intra link "
            f"{t.intra.alpha_s:.3g} s + {t.intra.beta_s_per_byte:.3g} s/B, inter link {t.inter.alpha_s:.3g} s + "
            f"{t.inter.beta_s_per_byte:.3g} s/B, message overhead {cal.realism.message_overhead_s:.3g} s, contention "
            f"{cal.realism.contention:.3g}; {cal.source}")


def cmd_presets(args: argparse.Namespace) -> None:
    obj = {name: {"workers": preset_workers(name), "doc": _preset_doc(name)} for name in preset_names()}
    rows = [(name, "any" if p["workers"] is None else ", ".join(map(str, p["workers"])), p["doc"])
            for name, p in obj.items()]
    _listing(args, obj, _table(rows, ("preset", "workers", "what it is")))


def _shipped_trace_headers() -> dict[str, dict]:
    """Name -> summary of every shipped trace (read as JSON; nothing is built)."""
    from repro.core.paths import shipped_trace_path, shipped_traces

    out = {}
    for name in shipped_traces():
        path = shipped_trace_path(name)
        t = load_trace(path)
        out[name] = {"model": t.model, "batch_size": t.batch_size, "device": t.device, "dtype": t.dtype,
                     "layers": t.num_layers, "params": t.total_params, "bytes": t.total_bytes,
                     "file": path.name}
    return out


def cmd_traces(args: argparse.Namespace) -> None:
    obj = _shipped_trace_headers()
    rows = [(name, t["model"], t["batch_size"], t["device"], t["layers"], f"{t['params']:,}")
            for name, t in obj.items()]
    _listing(args, obj, _table(rows, ("trace", "model", "batch", "device", "layers", "params")))


def cmd_models(args: argparse.Namespace) -> None:
    """The model catalogue (torch-free: nothing is built); parameters as counted by a shipped trace."""
    from repro.workload.catalog import MODEL_INFO

    params = {}
    for t in _shipped_trace_headers().values():
        params.setdefault(t["model"], t["params"])
    obj = {name: {"family": m.family, "kind": "tiny" if m.tiny else "paper", "input_size": list(m.input_size),
                  "num_classes": m.num_classes, "paper_batch_size": m.paper_batch_size,
                  "paper_batch_sizes": dict(m.paper_batch_sizes), "params": params.get(name),
                  "kwargs": list(m.kwargs), "source": m.source} for name, m in MODEL_INFO.items()}
    rows = [(name, m["family"], m["kind"], "x".join(map(str, m["input_size"])), m["num_classes"],
             m["paper_batch_size"], None if m["params"] is None else f"{m['params']:,}", m["source"])
            for name, m in obj.items()]
    _listing(args, obj, _table(rows, ("model", "family", "kind", "input", "classes", "paper batch", "params",
                                      "source")))


def build_parser() -> argparse.ArgumentParser:
    from repro import __version__

    parser = _Parser(prog="repro", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"repro {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log progress (-v) or details (-vv) on stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("profile", help="measure (or estimate) a model's per-layer trace",
                       description="Measure a model's per-layer forward/backward seconds on this device, or "
                                   "estimate them for a named GPU (roofline), and write the Trace JSON.")
    p.add_argument("--model", required=True,
                   help="model name, e.g. resnet50, bert_base, tiny_resnet (an unknown name is refused with the list "
                        "of valid ones), or a model of your own as package.module:factory: the factory (a function "
                        "or class; module:Class.method walks attributes) is called with no arguments and returns a "
                        "torch.nn.Module; the module is imported from the current folder or sys.path")
    p.add_argument("--batch-size", type=int, required=True, help="samples per step")
    p.add_argument("--input-shape", metavar="C,H,W",
                   help="a model of your own: one sample's input shape, comma-separated (e.g. 3,32,32 for images, "
                        "784 for flat vectors); it is profiled on standard-normal float32 inputs of shape "
                        "(batch, *shape) with cross-entropy loss on its (batch, classes) output")
    p.add_argument("--num-classes", type=int,
                   help="a model of your own: targets are integer classes uniform in [0, N) (default: the number "
                        "of outputs per sample, read from one forward pass made before profiling)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to measure")
    p.add_argument("--estimate-gpu", help="estimate for this named GPU (roofline) instead of measuring, e.g. "
                                          "V100 (an unknown name is refused with the list of valid ones)")
    p.add_argument("--view", default="module", choices=["module", "tensor"],
                   help="one layer per parameter-owning module, or per parameter tensor")
    p.add_argument("--autocast", choices=["bfloat16", "float16"],
                   help="measure mixed precision: each forward and its loss under torch.autocast with this dtype "
                        "(parameters and gradients keep theirs; recorded as the trace's precision); default: "
                        "the parameters' own precision")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (at most 1000)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (per-layer medians; at most 10000)")
    p.add_argument("-o", "--output", required=True, help="trace JSON file to write")
    p.set_defaults(func=cmd_profile)

    from repro.core.planners import planner_names

    p = sub.add_parser("plan", help="choose buckets for a trace under a cost model",
                       description="Run a planner on a trace and a cost model; print the Plan JSON with its "
                                   "predicted iteration seconds.")
    p.add_argument("--trace", required=True, help="trace JSON file or shipped trace name")
    p.add_argument("--solver", required=True, choices=planner_names(), help="planner")
    p.add_argument("--threshold-bytes", type=int, help="bucket threshold in bytes (>= 0) of the threshold, horovod and dear_threshold solvers")
    p.add_argument("--wire-dtype", choices=sorted(WIRE_DTYPE_BYTES),
                   help="communicate gradients in this dtype; the planner solves on those bytes")
    p.add_argument("--density", type=float, help="sparse planners: fraction of each bucket's elements sent, "
                   "k = ceil(density x elements), in (0, 1] (planner default 0.001)")
    p.add_argument("--pack", action="store_true", help="sparse planners: values and indices in one all-gather "
                   "message per bucket instead of two")
    p.add_argument("--topk-scope", choices=("bucket", "model"), help="sparse planners: each bucket sends its own "
                   "ceil(density x elements) (bucket: the paper's rule, the default) or that total is split between "
                   "the buckets each step by where the model's largest entries were the step before (model: this "
                   "package's variant)")
    p.add_argument("--servers", type=int, help="parameter-server planners (ps_*, osp*): server shards (default 1)")
    p.add_argument("--staleness", type=int, help="ps_ssp: iterations a worker may run ahead of the slowest "
                   "(planner default 2)")
    p.add_argument("--stage1-share", type=float, help="osp: fraction of the gradient bytes in the blocking stage 1, "
                   "in [0, 1] (planner default 0.5)")
    p.add_argument("--importance", choices=["position", "magnitude"], help="osp*: which layers go to stage 1 first "
                   "(magnitude needs a trace measured in a run; planner default position)")
    p.add_argument("--no-lgp", action="store_true", help="osp*: no local-gradient correction of stale parameters")
    p.add_argument("-o", "--output", help="write the plan here instead of stdout")
    _add_cost_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate one iteration of a plan",
                       description="Simulate one iteration of a trace under a plan and a cost model; print "
                                   "the iteration seconds and the timeline.")
    p.add_argument("--trace", required=True, help="trace JSON file or shipped trace name")
    p.add_argument("--plan", required=True, type=Path, help="plan JSON file (from `repro plan`)")
    p.add_argument("--no-ops", action="store_true", help="omit the timeline")
    p.add_argument("-o", "--output", help="write the result here instead of stdout")
    _add_cost_flags(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("compare", help="predict every scheduler's iteration on one trace and network",
                       description="Plan and simulate every scheduler of the registry on one trace and one cost "
                                   "model (e.g. your cluster: --nodes --gpus-per-node --inter-link); print each one's "
                                   "predicted iteration seconds, buckets and speedup over SyncEASGD. A scheduler "
                                   "that cannot be planned gets a note saying why. Same defaults as the "
                                   "compare_schedulers notebook (docs/compare.md); the top-k cost without "
                                   "--topk-gamma/--topk-device: the cost model's, else OMGS-SGD's published fit.")
    p.add_argument("--trace", required=True, help="trace JSON file or shipped trace name")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table: aligned columns for a person; csv; json: a list of records (units in the keys)")
    p.add_argument("--schedulers", metavar="A,B,...", help="only these schedulers (default: every one)")
    p.add_argument("--density", type=float, help="sparse planners: fraction of elements sent, in (0, 1] (default "
                                                 "0.001)")
    p.add_argument("--servers", type=int, help="parameter-server planners: server shards (default: one per node "
                                               "the job uses, else ceil(P / 4))")
    p.add_argument("--cost-mode", choices=["calibrated", "paper"], default="calibrated",
                   help="how a network preset becomes a cost model: calibrated (default): the cluster calibrated on "
                        "the published ddl-benchmarks measurements (10gbe-* -> 10gbe-calibrated, 56gbib-*/100gbib-* "
                        "-> 100gbib-calibrated; overhead and contention included), as the compare_schedulers "
                        "notebook; paper: the preset's published lines")
    p.add_argument("--time-budget-s", type=float, default=10.0,
                   help="exact planners (dear_optimal, omgs_optimal): seconds each may search before returning "
                        "its best plan with a proven gap")
    p.add_argument("-o", "--output", help="write the result here instead of stdout")
    _add_cost_flags(p)
    p.set_defaults(func=cmd_compare)

    from repro.cli.grid import add_grid_parser

    add_grid_parser(sub)  # repro grid show|status|launch: a paper's measured grid

    p = sub.add_parser("cost", help="cost files: `repro cost fit` fits one to your measured collectives",
                       description="Cost files (CostModel JSON), which --cost and --network take.")
    cost_sub = p.add_subparsers(dest="cost_command", required=True, parser_class=_Parser, metavar="ACTION")
    f = cost_sub.add_parser("fit", help="fit a cost file to measured collectives (CSV)",
                            description="Fit one line a + b*bytes per collective (relative-error least squares, as "
                                        "`repro calibrate`) to a CSV of your measurements with the columns bytes "
                                        "(message bytes), workers (P), seconds (one collective) and collective "
                                        "(allreduce, reduce_scatter, allgather, sparse_allgather, push, pull); print "
                                        "the CostModel JSON.")
    f.add_argument("measurements", type=Path, help="the CSV file")
    f.add_argument("--workers", type=int, help="fit the rows of this P (needed when the file has several)")
    f.add_argument("-o", "--output", help="write the cost file here instead of stdout")
    f.set_defaults(func=cmd_cost_fit)
    c = cost_sub.add_parser("cluster", help="write a cluster file: a cost model for any P (links, node size)",
                            description="Write a cluster file (JSON, schema repro.launch, version 1): the node size, "
                                        "the links and the collective algorithm of your cluster, from which every "
                                        "preset-taking command and notebook builds the cost model of any P on "
                                        "ceil(P / gpus-per-node) nodes (a cost file of `repro cost fit` or `repro "
                                        "calibrate` is a fit for one P).")
    c.add_argument("--gpus-per-node", type=int, required=True, help="devices per node G")
    c.add_argument("--inter-link", required=True, metavar="RATE[@LATENCY]",
                   help="the network between nodes, e.g. 25gbit, 100mbit@50us, 10GB/s@0.5ms (latency default 25us)")
    c.add_argument("--intra-link", metavar="RATE[@LATENCY]",
                   help="the link between devices of a node, e.g. 300GB/s@3us (latency default 5us; without it: "
                        "the intra-node link fitted on the measured V100 cluster, preset 10gbe-calibrated)")
    c.add_argument("--algorithm", default="ring", help="collective algorithm across the cluster: ring, hierarchical, "
                                                       "tree, recursive_doubling, halving_doubling")
    c.add_argument("--topk-gamma", type=float, metavar="S", help="top-k cost gamma in seconds (gamma d log2 d on d "
                                                                 "elements; default: none)")
    c.add_argument("--topk-device", metavar="GPU", help="top-k gamma of this GPU from the device table (K80, P100, "
                                                        "V100, A100, H100, P102)")
    c.add_argument("--name", help="a name for the cluster, recorded in the file and its cost models")
    c.add_argument("-o", "--output", help="write the cluster file here instead of stdout")
    c.set_defaults(func=cmd_cost_cluster)

    sub.add_parser("train", help="train one model with one scheduler, per rank (under torchrun); "
                                 "see `repro train --help`")

    p = sub.add_parser("launch", help="start N local ranks running `repro train ARGS` (optionally on an "
                                      "emulated network) and print rank 0's summary",
                       description="Start --nproc local ranks, each running `repro train ARGS` (optionally "
                                   "each in its own network namespace on links shaped to --emulate-bandwidth), "
                                   "and print rank 0's summary. The ranks use gloo unless ARGS say --backend "
                                   "nccl (which needs CUDA and a GPU per rank, checked before any rank starts); "
                                   "ARGS' --pg-timeout-s sets the ranks' process-group timeout. Bad ARGS fail "
                                   "in one line before any rank starts.")
    _add_local_flags(p)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- followed by `repro train` arguments")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("calibrate", help="measure collectives on N local ranks and fit a cost model",
                       description="Time collectives on N local ranks (optionally on an emulated network), or "
                                   "on every rank of a torchrun job across nodes (--torchrun), and fit one line "
                                   "a + b*bytes per collective (relative-error least squares); print the "
                                   "CostModel JSON with its measurements (rank 0).")
    p.add_argument("--nproc", type=int,
                   help="ranks to start on this machine (at most what its memory and process limit allow); "
                        "required unless --torchrun")
    p.add_argument("--torchrun", action="store_true",
                   help="this process is one rank of a torchrun job (any number of nodes, e.g. `torchrun "
                        "--nnodes 2 --nproc-per-node 8 ... -m repro calibrate --torchrun -o cost.json`): join "
                        "its process group (nccl with CUDA, else gloo) instead of starting ranks")
    p.add_argument("--emulate-bandwidth", help="run each rank in its own network namespace with links shaped "
                                               "to this rate, e.g. 100mbit, 1gbit (needs root and tc)")
    p.add_argument("--timeout-s", type=float, default=3600.0,
                   help="give up (and kill the ranks) after this many seconds (finite, positive)")
    p.add_argument("--collectives", default="allreduce",
                   help="comma-separated: allreduce, reduce_scatter, allgather, sparse_allgather")
    p.add_argument("--min-bytes", type=int, default=4096, help="smallest message, bytes (>= 4)")
    p.add_argument("--max-bytes", type=int, default=16 * 2**20, help="largest message, bytes (>= 4 x --min-bytes)")
    p.add_argument("--sizes", type=int, default=8, help="number of message sizes, geometric (2-64)")
    p.add_argument("--repeats", type=int, default=5, help="timings per size (1-1000); the median counts")
    p.add_argument("-o", "--output", help="write the CostModel JSON here instead of stdout")
    p.set_defaults(func=cmd_calibrate)

    listings = [
        ("schedulers", cmd_schedulers, "list every scheduler (planner or baseline, executor, paper, what it "
                                       "supports) and every plan family"),
        ("presets", cmd_presets, "list the network presets (published and calibrated)"),
        ("models", cmd_models, "list the models (family, input, classes, the papers' batch size, parameters as "
                               "counted by a shipped trace; nothing is built)"),
        ("traces", cmd_traces, "list the shipped traces (name, model, batch size, device, layers): the names "
                               "--trace takes"),
    ]
    for name, func, what in listings:
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("--format", choices=["table", "json"], default="table",
                       help="table: aligned columns for a person; json: everything, for scripts")
        p.set_defaults(func=func)
    return parser


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # per-rank training entry point (run it under torchrun)
        if {"-h", "--help"} & set(argv[1:]):  # the options, without importing torch
            from repro.training.config import build_parser as train_parser

            try:
                train_parser().parse_args(argv[1:])
            except ValueError as e:
                print(f"repro: error: {_first_line(e)}", file=sys.stderr)
                return 2
        from repro.train import main as train_main

        return train_main(argv[1:], hard_exit=True)
    if hasattr(signal, "SIGPIPE"):  # `repro presets | head`: end quietly when the reader goes away
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = None
    try:
        args = build_parser().parse_args(argv)
        from repro.log import configure

        configure(args.verbose, args.quiet)
        import numpy as np

        with np.errstate(all="ignore"):  # an overflow becomes inf or NaN, refused in one line (_emit), not warned
            args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("repro: interrupted", file=sys.stderr)
        return 130
    except (UsageError, TraceError, PlanError, CostModelError, ValueError, FileNotFoundError, RuntimeError,
            TimeoutError, OSError) as e:
        print(f"repro: error: {_first_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug still ends in one line (-vv before the command: the traceback)
        if args is not None and args.verbose >= 2:
            traceback.print_exc()
        print(f"repro: error: {type(e).__name__}: {_first_line(e)} (an internal error; please report it)",
              file=sys.stderr)
        return 2
    finally:
        release_outputs()  # a FIFO checked at the start but never written: its reader sees the end of file
    return 0


if __name__ == "__main__":
    sys.exit(main())
