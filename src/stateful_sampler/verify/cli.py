"""``stateful-sampler verify --config CONFIG.yaml [--kill-at STEP] [--devices N]`` or ``... -- COMMAND``

Proves, on the user's own LightningCLI config or training command, that a run killed with SIGKILL
mid-epoch and resumed trains on exactly the batches of the run never interrupted, and ends with
bitwise-equal weights; or shows where the two first diverge, and why when only the weights do.

A config: every run uses its int ``seed_everything`` (0 when it is random or off), ``deterministic``,
no logger and no progress bar, writes its checkpoints into the work directory and resumes with
``ckpt_path="last"``; it needs a ``ModelCheckpoint(every_n_train_steps=N, save_last=True)``. A command
(after ``--``) is run again to resume: it checkpoints into {run_dir}, feeds training through a
``ResumableLoader`` and calls ``stateful_sampler.verify.record_weights(model)`` at the end.
``--resize A:B`` runs the command at world size A (``{devices}``) and resumes it at B, where the
elastic rules decide (``verify.resize``): per epoch the same records, each once, equal steps per rank.
``--agents N`` runs the command as N torchrun agents of one job (``{rdzv}``: the rendezvous verify
hosts), kills one with its workers, and the same rules judge the group the others re-form.

Exit codes: 0 equal, 1 diverged, 2 could not run (the reason on stderr; a failed run's work
directory is kept for its logs). Progress goes to stderr, the report to stdout (``--json``: one
JSON object). SIGTERM stops every run it started.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from stateful_sampler.verify.compare import ResumeReport
from stateful_sampler.verify.errors import TrainingRunError
from stateful_sampler.verify.resize import ResizeReport
from stateful_sampler.verify.resume_check import (
    DEFAULT_TIMEOUT,
    check_agents,
    check_resize,
    check_resume,
    check_timeout,
)

EXIT_EQUAL, EXIT_DIVERGED, EXIT_RUN_FAILED = 0, 1, 2
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# What a run needs that an extra installs: the module's top-level name -> the extra.
DESCRIPTION = (
    "Prove that your training, killed with SIGKILL mid-epoch and resumed, trains on exactly the batches of "
    "the run never interrupted and ends with bitwise-equal weights; or see where the two first diverge, "
    "and why when only the weights do."
)
EPILOG = """\
examples:
  stateful-sampler verify --config my_config.yaml
  stateful-sampler verify --kill-at 25 -- python train.py --root {run_dir}
  stateful-sampler verify --kills 3 -- python train.py --root {run_dir}
  stateful-sampler verify --devices 2 -- torchrun --nproc-per-node {devices} train.py --root {run_dir}
  stateful-sampler verify --resize 4:2 -- torchrun --nproc-per-node {devices} train.py --root {run_dir}
  stateful-sampler verify --agents 2 -- torchrun --nnodes 1:2 --nproc-per-node 2 --max-restarts 1 \\
      --rdzv-backend c10d --rdzv-endpoint {rdzv} train.py --root {run_dir}

--config: a LightningCLI config with ModelCheckpoint(every_n_train_steps=N, save_last=True);
  resumed with ckpt_path="last", with your int seed_everything (else 0).
-- COMMAND: run again to resume. It checkpoints into {run_dir} (a directory of each run's
  own) and resumes from there, feeds its batches through a ResumableLoader (or Lightning with
  SamplerCheckpoint) and calls stateful_sampler.verify.record_weights(model) after training.

--resize A:B: the uninterrupted and the killed run at world size A, every resumed run at B
  ({devices} in the command); equal means per epoch the same records, each once, every rank the
  same steps, and the batches of the killed run identical (docs/verify.md).

--agents N: the command is N torchrun agents of one job, meeting at {rdzv} (a rendezvous store
  verify hosts on a free loopback port); agent --kill-agent (default N) is killed with its workers
  after a step drawn from --kill-seed (or --kill-at), the others re-form the group and finish: the
  --resize rules judge it.

exit codes: 0 equal, 1 diverged, 2 could not run (the reason on stderr; a failed run's work
directory is kept for its logs). Progress goes to stderr, the report to stdout."""
_EXTRAS = {
    "lightning": "lightning",
    "jsonargparse": "lightning",
    "yaml": "lightning",
    "pytorch_lightning": "pytorch-lightning",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1 :] if "--" in argv else None
    options = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="stateful-sampler verify",
        usage="%(prog)s (--config CONFIG | -- COMMAND ...) [--kill-at STEP] [--devices N] [--timeout S] "
        "[--kills N] [--kill-seed S] [--resize A:B] [--agents N [--kill-agent I]] [--work-dir D] [--json]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="a LightningCLI YAML config for fit")
    parser.add_argument(
        "--kill-at", type=int, metavar="STEP", help="steps done when the run is killed (default: mid-run)"
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=1,
        metavar="N",
        help="kill the run at N random steps of one epoch, each time resuming from its last checkpoint (default: 1)",
    )
    parser.add_argument(
        "--kill-seed", type=int, default=0, metavar="S", help="seed of the --kills steps' draw (default: 0)"
    )
    parser.add_argument(
        "--devices", type=int, metavar="N", help="override trainer.devices (e.g. 2 for CPU DDP), or fill {devices}"
    )
    parser.add_argument(
        "--resize",
        type=_sizes,
        metavar="A:B",
        help="run and kill at world size A, resume at B: {devices} in the command becomes each",
    )
    parser.add_argument(
        "--agents",
        type=_agents,
        metavar="N",
        help="run the command as N torchrun agents of one job ({rdzv}: the rendezvous verify hosts) and kill one",
    )
    parser.add_argument(
        "--kill-agent",
        type=int,
        metavar="I",
        help="with --agents: the agent killed with its workers, 1 to N (default: N, the last started)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds allowed for each of the three runs (default: %(default)g)",
    )
    parser.add_argument("--work-dir", help="keep the runs' records, checkpoints and logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    args = parser.parse_args(options)
    if (args.config is None) == (command is None):
        parser.error("give either --config CONFIG or -- COMMAND ..., not both or neither")
    if command == []:
        parser.error("no command after --")
    if args.resize is not None and command is None:
        parser.error("--resize resumes a command at another world size: give -- COMMAND with {devices} in it")
    if args.resize is not None and args.devices is not None:
        parser.error("--resize A:B sets the world sizes: drop --devices")
    _refuse_agents_with(parser, args, command)
    try:
        with _stop_signals_exit():
            progress = lambda message: print(message, file=sys.stderr, flush=True)
            if args.agents is not None or args.resize is not None:
                kill = {"kill_at": args.kill_at, "kill_seed": args.kill_seed, "timeout": args.timeout,
                        "work_dir": args.work_dir, "progress": progress}  # fmt: skip
                resized = (
                    check_agents(command or [], args.agents, kill_agent=args.kill_agent, **kill)
                    if args.agents is not None
                    else check_resize(command or [], args.resize, kills=args.kills, **kill)
                )
                print(json.dumps(resize_json(resized)) if args.json else format_resize(resized), flush=True)
                return EXIT_EQUAL if resized.equal else EXIT_DIVERGED
            report = check_resume(
                args.config if command is None else command,
                kill_at=args.kill_at,
                kills=args.kills,
                kill_seed=args.kill_seed,
                devices=args.devices,
                timeout=args.timeout,
                work_dir=args.work_dir,
                progress=progress,
            )
    except (TrainingRunError, FileNotFoundError, ValueError, TypeError) as error:
        return _could_not_run(str(error), args.json)
    except ImportError as error:
        return _could_not_run(_missing(error), args.json)
    except Exception as error:  # noqa: BLE001  # a bug of verify's own: still "could not run", never "diverged"
        traceback.print_exc(file=sys.stderr)
        return _could_not_run(f"unexpected {type(error).__name__}: {error}", args.json)
    print(json.dumps(report_json(report)) if args.json else format_report(report), flush=True)
    return EXIT_EQUAL if report.equal else EXIT_DIVERGED


def _refuse_agents_with(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str] | None) -> None:
    """The flags --agents cannot run with, each refused by name (exit 2)."""
    if args.agents is None:
        if args.kill_agent is not None:
            parser.error("--kill-agent names the agent that --agents kills: give --agents N")
        return
    if command is None:
        parser.error("--agents starts a command as torchrun agents: give -- COMMAND with {rdzv} in it")
    if args.resize is not None:
        parser.error("--agents sets the world sizes (the killed agent's workers leave the group): drop --resize")
    if args.devices is not None:
        parser.error("--agents: drop --devices; give each agent's processes in the command (--nproc-per-node)")
    if args.kills != 1:
        parser.error("--agents kills one agent once: drop --kills")
    if args.kill_agent is not None and not 1 <= args.kill_agent <= args.agents:
        parser.error(f"--kill-agent must be between 1 and {args.agents} (--agents), got {args.kill_agent}")


def _could_not_run(reason: str, as_json: bool) -> int:
    print(f"verify could not complete: {reason}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps({"verdict": "could not run", "exit_code": EXIT_RUN_FAILED, "error": reason}), flush=True)
    return EXIT_RUN_FAILED


def _missing(error: ImportError) -> str:
    top = (error.name or "").split(".")[0]
    extra = _EXTRAS.get(top)
    install = f"pip install 'stateful-sampler[{extra}]'" if extra else f"install the package that provides {top!r}"
    return f"a module verify needs is not installed ({error}): {install}"


def _sizes(text: str) -> tuple[int, int]:
    first, colon, second = text.partition(":")
    if colon and first.isdigit() and second.isdigit() and int(first) > 0 and int(second) > 0:
        return int(first), int(second)
    raise argparse.ArgumentTypeError(f"expected two world sizes above 0 as A:B, e.g. 4:2, got {text!r}")


def _agents(text: str) -> int:
    if text.isdigit() and int(text) >= 2:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 2 or more agents (one is killed, the others finish), got {text!r}")


def _seconds(text: str) -> float:
    try:
        return check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text!r}") from None


@contextmanager
def _stop_signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP become ``SystemExit(128 + signal)``, so the runner's ``finally`` kills the
    run's process group and the temporary work directory is removed on the way out, as for Ctrl-C.
    Handlers can only be set from the main thread; elsewhere the signals keep their defaults."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in _STOP_SIGNALS}

    def stop(number: int, frame: FrameType | None) -> None:
        for each in _STOP_SIGNALS:  # a second signal must not interrupt the cleanup
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(128 + number)

    for number in _STOP_SIGNALS:
        signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def format_report(report: ResumeReport) -> str:
    steps = report.batches_compared // max(report.ranks, 1)
    other = report.batches_compared - report.identical_batches
    killed = (
        f"killed after step {report.kill_at}; resumed from the checkpoint at step {report.resumed_from}"
        if len(report.kill_steps) < 2
        else f"killed {len(report.kill_steps)} times, after steps {', '.join(map(str, report.kill_steps))}; "
        f"resumed each time from the last checkpoint, at steps {', '.join(map(str, report.resumed_froms))}"
    )
    lines = [
        killed,
        (
            f"batches compared: {report.batches_compared} ({steps} steps x {report.ranks} rank(s)), "
            f"identical to the uninterrupted run's: {report.identical_batches}"
            + (f", different or never trained on: {other}" if other else "")
        ),
        f"final weights: uninterrupted {report.reference_weights}, resumed {report.resumed_weights}",
    ]
    if report.equal:
        lines.append("EQUAL: the killed and resumed run trained on exactly the batches of the uninterrupted run, "
                     "and its final weights are bitwise identical")  # fmt: skip
        return "\n".join(lines)
    if report.first_divergence is not None:
        lines.append(f"DIVERGED: first divergence at {report.first_divergence}")
    if report.weight_divergence is not None and report.weights_cause is not None:
        lines.append(f"DIVERGED: {report.weights_cause}")
        lines.append(f"  ({report.weight_divergence})")
    elif report.weight_divergence is not None:
        lines.append(f"DIVERGED: {report.weight_divergence}")
    return "\n".join(lines)


def report_json(report: ResumeReport) -> dict[str, Any]:
    """The report's verdict and evidence as plain values, for ``--json``."""
    return {
        "verdict": "equal" if report.equal else "diverged",
        "exit_code": EXIT_EQUAL if report.equal else EXIT_DIVERGED,
        "kill_at": report.kill_at,
        "kill_steps": list(report.kill_steps) or [report.kill_at],
        "resumed_froms": list(report.resumed_froms),
        "resumed_from": report.resumed_from,
        "batches_compared": report.batches_compared,
        "identical_batches": report.identical_batches,
        "ranks": report.ranks,
        "first_divergence": report.first_divergence,
        "weight_divergence": report.weight_divergence,
        "weights_cause": report.weights_cause,
        "reference_weights": report.reference_weights,
        "resumed_weights": report.resumed_weights,
    }


def format_resize(report: ResizeReport) -> str:
    """The resize report: where each run was killed and resumed, and each rule, held or not."""
    before, after = report.sizes
    steps = ", ".join(f"epoch {epoch}: {count}" for epoch, count in report.steps_per_rank)
    lines = [
        _killed_line(report),
        f"exact (the layout kept): {report.exact_identical} of the killed run's {report.exact_compared} batches at "
        f"world size {before} identical to the uninterrupted run's"
        + (f"; {report.retrained} batches at world size {after} retrained after a kill" if report.retrained else ""),
        f"records: {report.records} over {report.epochs} epoch(s); steps of each rank at world size {after}: {steps}",
        "global order: "
        + ("held: the epochs' records in the uninterrupted run's order" if report.global_order else "not held"),
        "final weights: not compared (at another world size each step averages other records)",
    ]
    if report.equal:
        lines.append(
            f"EQUAL ({report.rule} rule): resumed at world size {after}, every epoch trained on the uninterrupted "
            "run's records, each once, with the same steps on every rank"
        )
        return "\n".join(lines)
    lines.append(f"DIVERGED: first divergence at {report.first_divergence}")
    if report.resume_problem is not None and report.resume_problem != report.first_divergence:
        lines.append(f"DIVERGED: at {report.resume_problem}")
    return "\n".join(lines)


def _killed_line(report: ResizeReport) -> str:
    before, after = report.sizes
    kills = ", ".join(map(str, report.kill_steps))
    if report.killed_agent is not None:
        agent, agents = report.killed_agent
        drawn = "" if report.kill_seed is None else f" (drawn with --kill-seed {report.kill_seed})"
        return (
            f"agent {agent} of {agents} killed with its workers after step {kills}{drawn} at world size {before}; "
            f"the agents left re-formed the group at world size {after} from {report.resumed_froms[0]}"
        )
    killed = (
        f"killed after step {kills} at world size {before}"
        if len(report.kill_steps) == 1
        else f"killed after steps {kills} (the first at world size {before}, the others at {after})"
    )
    return f"{killed}; resumed at world size {after} from " + "; then from ".join(report.resumed_froms)


def resize_json(report: ResizeReport) -> dict[str, Any]:
    """The resize report as plain values, for ``--json``."""
    return {
        "verdict": "equal" if report.equal else "diverged",
        "exit_code": EXIT_EQUAL if report.equal else EXIT_DIVERGED,
        "rule": report.rule if report.equal else None,
        "sizes": list(report.sizes),
        "kill_steps": list(report.kill_steps),
        "resumed_froms": list(report.resumed_froms),
        "exact_compared": report.exact_compared,
        "exact_identical": report.exact_identical,
        "retrained": report.retrained,
        "records": report.records,
        "epochs": report.epochs,
        "steps_per_rank": dict(report.steps_per_rank),
        "global_order": report.global_order,
        "first_divergence": report.first_divergence,
        "resume_problem": report.resume_problem,
    } | (
        {}
        if report.killed_agent is None
        else {"killed_agent": report.killed_agent[0], "agents": report.killed_agent[1], "kill_seed": report.kill_seed}
    )
