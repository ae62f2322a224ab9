"""``stateful-sampler audit``: the coverage audit from the command line.

Describe the run with flags (``--size --world-size --batch-size --tail ...``, and the order's
``--strategy`` with its ``--labels``/``--weights`` files) or point at a LightningCLI config
(``--config``), whose train loader's sampler and batch settings are audited. ``--labels`` also adds
the batch composition per class. Lightning is imported only for ``--config``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stateful_sampler.audit.cli_strategy import STRATEGIES, describe
from stateful_sampler.audit.compute import audit
from stateful_sampler.audit.cost import estimate
from stateful_sampler.audit.report import AuditReport
from stateful_sampler.audit.setup import AuditConfig, on_rank
from stateful_sampler.audit.table import render
from stateful_sampler.extras import missing_extra
from stateful_sampler.order.policies import Order, Tail
from stateful_sampler.sampler import StatefulSampler

_PROG = "stateful-sampler audit"
_USAGE = f"""
  {_PROG} (--size N | --labels FILE.npy) --batch-size B [--world-size W] [options]
  {_PROG} --config CONFIG.yaml [--world-size W] [options]"""
_DESCRIPTION = """\
Report what each epoch of a run really feeds the model, counted from the sampler's own code:
occurrences against distinct records, padding repeats, records cut by the tail policy or by
drop_last, steps per rank (unequal counts hang DDP), 1-sample batches, coverage over epochs and
batch-mate diversity. Describe the run with flags, or give a LightningCLI config whose train
loader is audited as it would be built (its modules are imported from the current directory)."""
_EPILOG = f"""\
examples:
  {_PROG} --size 10 --world-size 3 --batch-size 3 --tail pad --epochs 2
  {_PROG} --labels labels.npy --strategy stratified --batch-size 64 --plot comp.png
  python -m stateful_sampler.demo --shipped-config > digits.yaml && {_PROG} --config digits.yaml --world-size 8

exit status: 0 the report was printed, 2 the arguments or the config could not be used."""
_SAMPLER_FLAGS = ("size", "seed", "tail", "order", "shuffle", "strategy", "weights", "mode")  # the config's


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = _audit(args, before=_announce)
        if args.plot:
            from stateful_sampler.audit.plot import plot

            plot(report, args.plot)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n" if args.json else render(report))
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _announce(occurrences: int) -> None:
    message = estimate(occurrences)
    if message is not None:
        print(f"{_PROG}: {message}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        usage=_USAGE,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run = parser.add_argument_group("the run (without --config)")
    run.add_argument("--size", type=int, metavar="N",
                     help="records in the dataset (required, unless --labels gives one entry per record)")  # fmt: skip
    run.add_argument("--world-size", type=int, metavar="W", help="ranks (default 1; with --config: the sampler's)")
    run.add_argument("--batch-size", type=int, metavar="B",
                     help="per-rank batch of the loader (required; with --config: the loader's)")  # fmt: skip
    run.add_argument("--tail", choices=[tail.value for tail in Tail], help="tail policy (default pad)")
    run.add_argument("--order", choices=[order.value for order in Order], help="order (default fast)")
    run.add_argument("--seed", type=int, metavar="S", help="the order's seed (default 0)")
    run.add_argument("--shuffle", action=argparse.BooleanOptionalAction, help="shuffle each epoch (default on)")
    run.add_argument(
        "--drop-last", action=argparse.BooleanOptionalAction, help="the loader drops a short last batch (default off)"
    )
    run.add_argument("--num-workers", type=int, metavar="N", help="loader workers (reported; they change no count)")
    run.add_argument("--strategy", choices=STRATEGIES, help="the order of each pass (default uniform)")
    run.add_argument("--labels", metavar="FILE.npy",
                     help="one class (group, band) id per record: stratified/grouped/curriculum order by it, "
                          "and the audit reports each batch's composition")  # fmt: skip
    run.add_argument("--weights", metavar="FILE.npy", help="one weight per record (--strategy weighted)")
    run.add_argument("--mode", choices=["proportional", "balanced"], help="--strategy stratified's mode")
    run.add_argument("--config", metavar="CONFIG.yaml",
                     help="audit the train loader of a LightningCLI config instead (needs the lightning extra)")  # fmt: skip
    audited = parser.add_argument_group("what to audit and how to show it")
    audited.add_argument("--epochs", type=int, default=1, metavar="E", help="epochs to audit (default 1)")
    audited.add_argument("--start-epoch", type=int, default=0, metavar="E", help="first epoch audited (default 0)")
    audited.add_argument("--json", action="store_true", help="machine-readable output")
    audited.add_argument("--plot", metavar="FILE.png", help="write a picture (needs the plot extra)")
    return parser


def _audit(args: argparse.Namespace, before: Any = None) -> AuditReport:
    loader: dict[str, Any] = {}
    source: StatefulSampler | AuditConfig
    if args.config:
        clashes = [f"--{name}" for name in _SAMPLER_FLAGS if getattr(args, name) is not None]
        if clashes:
            raise ValueError(f"{', '.join(clashes)} cannot be combined with --config: the config defines the sampler")
        source, loader = _from_config(args.config, args.world_size)
        described = describe("uniform", args.labels, None, None)  # the labels only, for the composition
    else:
        described = describe(args.strategy or "uniform", args.labels, args.weights, args.mode)
        size = args.size
        if described.labels is not None:
            if size is not None and size != len(described.labels):
                raise ValueError(f"--labels must have one entry per record: length {size}, got {len(described.labels)}")
            size = len(described.labels)
        if size is None:
            raise ValueError("--size is required (or --labels FILE.npy, or --config CONFIG.yaml)")
        if args.batch_size is None:
            raise ValueError("--batch-size is required: the loader's per-rank batch (or --config CONFIG.yaml)")
        source = AuditConfig(
            size=size,
            world_size=1 if args.world_size is None else args.world_size,
            seed=0 if args.seed is None else args.seed,
            shuffle=True if args.shuffle is None else args.shuffle,
            tail=args.tail or Tail.PAD.value,
            order=args.order or Order.FAST.value,
            strategy=described.strategy,
        )
    given = {"batch_size": args.batch_size, "drop_last": args.drop_last, "num_workers": args.num_workers}
    loader.update({name: value for name, value in given.items() if value is not None})
    return audit(source, epochs=args.epochs, start_epoch=args.start_epoch, labels=described.labels,
                 target=described.target, before=before, **loader)  # fmt: skip


def _from_config(path: str, world_size: int | None) -> tuple[StatefulSampler, dict[str, Any]]:
    """The config's train loader: its ``StatefulSampler`` and its batch settings."""
    try:
        from stateful_sampler.verify.lightning_cli.config import build_train_dataloader
    except ModuleNotFoundError as error:
        raise missing_extra(error, "lightning", "--config") from error

    with _as_python_m(), _quiet_lightning():
        loader = build_train_dataloader(path)
    batch_sampler = loader.batch_sampler
    sampler = loader.sampler if loader.batch_size is not None else getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, StatefulSampler):
        raise TypeError(
            f"the train loader of {path} samples with {type(sampler).__name__}, not a StatefulSampler: "
            "the audit reads the order from StatefulSampler"
        )
    if world_size is not None:
        sampler = on_rank(sampler, world_size, 0)
    settings = {
        "batch_size": loader.batch_size
        if loader.batch_size is not None
        else getattr(batch_sampler, "batch_size", None),
        "drop_last": loader.drop_last if loader.batch_size is not None else getattr(batch_sampler, "drop_last", False),
        "num_workers": loader.num_workers,
    }
    return sampler, settings


@contextmanager
def _as_python_m() -> Iterator[None]:
    """Import the config's modules from the current directory, as ``python -m`` (and so ``verify
    --config``, which runs the config under ``python -m``) would; the console script's own
    ``sys.path`` starts at its bin directory instead."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        sys.path.remove(cwd)


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Build the loader without the noise our own call causes: LightningCLI warns when ``sys.argv``
    holds arguments besides the ``args`` it is given (they are audit's), and the Trainer it builds
    logs a start-up banner at INFO (seed, GPU and TPU, a logger tip). Warnings about the user's own
    config still show."""
    argv, disabled = sys.argv, logging.root.manager.disable
    sys.argv = argv[:1]
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        sys.argv = argv
        logging.disable(disabled)
