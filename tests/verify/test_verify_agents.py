"""``stateful-sampler verify --agents 2``: a TorchElastic job of two real torchrun agents on loopback
(c10d rendezvous hosted by verify, gloo, 2 workers each), one agent SIGKILLed with its workers after
a drawn step while the other re-forms the group alone at world size 2 and finishes. The example is
EQUAL by the global order rule; a script that forgets its loader at the re-rendezvous is DIVERGED,
naming the first step and records trained twice. The command line refuses what --agents cannot run,
naming the flag; a round whose workers started twice cannot be compared (fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stateful_sampler import StatefulSampler
from stateful_sampler.verify.cli import EXIT_DIVERGED, EXIT_EQUAL, EXIT_RUN_FAILED, format_resize, main
from stateful_sampler.verify.errors import TrainingRunError
from stateful_sampler.verify.resize import ResizeReport
from stateful_sampler.verify.resume_check import read_round

ROOT = Path(__file__).parents[2]
# Each agent: 2 workers; the survivor (1:2 nodes) re-forms the group alone once the dead agent's
# keep-alive (2 s x 3) expires and its last call (5 s) passes; the agents start at once, well within it.
AGENT = [
    sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1",
    "--monitor-interval", "0.2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv}", "--local-addr", "127.0.0.1",
    "--rdzv-conf", "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=3",
]  # fmt: skip


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six small gloo processes on 2 cores: one thread each; a fresh rendezvous store for each restart
    of the workers (docs/torchelastic.md: torch 2.13's shared store hangs a restarted gloo group)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


@pytest.mark.slow
def test_the_elastic_example_with_an_agent_killed_is_equal_by_the_global_order_rule(
    tmp_path: Path, one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # examples/torchrun_elastic.py, 1 epoch: 48 records, 2 a rank per step, a checkpoint every 3 steps:
    # 6 steps at world size 4. --kill-seed 0 draws step 4 of steps 3..5; agent 2's workers pause there,
    # agent 1's take their step-4 batch and wait in its all-reduce (4 + 4 + 5 + 5 batches at world size 4).
    example = [*AGENT, str(ROOT / "examples" / "torchrun_elastic.py"), "--root", "{run_dir}", "--epochs", "1"]
    work = tmp_path / "work"
    assert main(["--agents", "2", "--work-dir", str(work), "--", *example]) == EXIT_EQUAL
    assert capsys.readouterr().out == (
        "agent 2 of 2 killed with its workers after step 4 (drawn with --kill-seed 0) at world size 4; the agents "
        "left re-formed the group at world size 2 from step 3 (epoch 0, record 24 of 48, world size 2)\n"
        "exact (the layout kept): 18 of the killed run's 18 batches at world size 4 identical to the "
        "uninterrupted run's\n"
        "records: 48 over 1 epoch(s); steps of each rank at world size 2: epoch 0: 6\n"
        "global order: held: the epochs' records in the uninterrupted run's order\n"
        "final weights: not compared (at another world size each step averages other records)\n"
        "EQUAL (global order rule): resumed at world size 2, every epoch trained on the uninterrupted run's "
        "records, each once, with the same steps on every rank\n"
    )
    # The survivor's restarted workers loaded the checkpoint rank 0 wrote at world size 4.
    assert "restart 1: resumed from step 3 at world size 2" in (work / "crash" / "killed.agent1.log").read_text()
    assert sorted(path.name for path in (work / "crash").glob("killed.restart1.rank*.jsonl")) == [
        "killed.restart1.rank0.jsonl",
        "killed.restart1.rank1.jsonl",
    ]


@pytest.mark.slow
def test_a_script_that_forgets_its_loader_at_the_re_rendezvous_is_diverged_naming_the_records_trained_twice(
    one_thread: None, capsys: pytest.CaptureFixture
) -> None:
    # resize_script.py: 32 records, 2 a rank per step, a checkpoint every 2 steps. Agent 1 (which may host
    # rank 0: verify hosts the rendezvous store, so either agent can die) is killed after step 3; agent 2's
    # workers come back at world size 2 and restore the model and optimizer, not the loader.
    script = [*AGENT, str(Path(__file__).with_name("resize_script.py")), "--root", "{run_dir}"]
    arguments = ["--agents", "2", "--kill-agent", "1", "--kill-at", "3", "--json", "--"]
    assert main([*arguments, *script, "--forget-loader-at-resize"]) == EXIT_DIVERGED
    report = json.loads(capsys.readouterr().out)
    first_at_2 = list(StatefulSampler(range(32), seed=5, batch_size=2, num_replicas=2, rank=0))[:2]
    assert report["first_divergence"] == (
        f"step 2 (epoch 0, batch 0 at world size 2), rank 0: records {first_at_2} trained on a second time in "
        "epoch 0 (first at step 0)"
    )
    assert report["resume_problem"].startswith(
        "step 2, where the run killed after step 3 resumes at world size 2: the resumed run started at epoch 0, "
        "record 0, not at the last checkpoint (epoch 0, record 16): the loader's state was not restored."
    )
    assert {key: report[key] for key in ("verdict", "exit_code", "rule", "sizes", "kill_steps", "global_order")} == {
        "verdict": "diverged", "exit_code": 1, "rule": None, "sizes": [4, 2], "kill_steps": [3], "global_order": False,
    }  # fmt: skip
    assert (report["killed_agent"], report["agents"], report["kill_seed"]) == (1, 2, None)
    assert (report["exact_compared"], report["exact_identical"]) == (14, 14)  # 3 + 3 + 4 + 4 batches at 4


COMMAND = ["torchrun", "--nnodes", "1:2", "--rdzv-endpoint", "{rdzv}", "train.py", "--root", "{run_dir}"]


REFUSED = {  # id: (arguments, what verify says)
    "one-agent": (
        ["--agents", "1", "--", *COMMAND],
        "argument --agents: expected 2 or more agents (one is killed, the others finish), got '1'",
    ),
    "no-agents": (
        ["--kill-agent", "1", "--", *COMMAND],
        "--kill-agent names the agent that --agents kills: give --agents N",
    ),
    "config": (
        ["--agents", "2", "--config", "x.yaml"],
        "--agents starts a command as torchrun agents: give -- COMMAND with {rdzv} in it",
    ),
    "resize": (
        ["--agents", "2", "--resize", "4:2", "--", *COMMAND],
        "--agents sets the world sizes (the killed agent's workers leave the group): drop --resize",
    ),
    "devices": (
        ["--agents", "2", "--devices", "2", "--", *COMMAND],
        "--agents: drop --devices; give each agent's processes in the command (--nproc-per-node)",
    ),
    "kills": (["--agents", "2", "--kills", "3", "--", *COMMAND], "--agents kills one agent once: drop --kills"),
    "kill-agent-range": (
        ["--agents", "2", "--kill-agent", "3", "--", *COMMAND],
        "--kill-agent must be between 1 and 2 (--agents), got 3",
    ),
}


@pytest.mark.parametrize(("arguments", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_verify_refuses_agents_it_cannot_run(arguments: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == EXIT_RUN_FAILED
    assert capsys.readouterr().err.splitlines()[-1] == f"stateful-sampler verify: error: {message}"


def test_verify_refuses_agents_of_a_command_without_a_rendezvous_placeholder(capsys: pytest.CaptureFixture) -> None:
    command = ["torchrun", "--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400", "train.py"]
    assert main(["--agents", "2", "--", *command]) == EXIT_RUN_FAILED
    assert capsys.readouterr().err == (
        "verify could not complete: agents (--agents): the command has no {rdzv} to put the rendezvous endpoint "
        "verify hosts in; write it where torchrun takes it, e.g. torchrun --nnodes 1:2 --rdzv-backend c10d "
        "--rdzv-endpoint {rdzv} ...\n"
    )


def test_the_report_names_the_agent_killed_and_the_seed_of_its_step() -> None:
    report = ResizeReport(
        sizes=(6, 4), kill_steps=(5,), resumed_froms=("step 4 (epoch 0, record 48 of 96, world size 4)",),
        exact_compared=32, exact_identical=32, retrained=0, records=96, epochs=1, steps_per_rank=((0, 6),),
        global_order=True, first_divergence=None, resume_problem=None, killed_agent=(3, 3), kill_seed=7,
    )  # fmt: skip
    assert format_resize(report).splitlines()[0] == (
        "agent 3 of 3 killed with its workers after step 5 (drawn with --kill-seed 7) at world size 6; the agents "
        "left re-formed the group at world size 4 from step 4 (epoch 0, record 48 of 96, world size 4)"
    )


def test_a_round_whose_workers_started_twice_cannot_be_compared(tmp_path: Path) -> None:
    # An agent that completed the rendezvous alone trained 2 steps, then restarted its workers when the
    # other agent joined: TORCHELASTIC_RESTART_COUNT stays 0, so both starts record into restart0.
    lines = [{"kind": "batch", "rank": 0, "epoch": 0, "batch_idx": place, "step": step, "fingerprint": "f",
              "indices": [place]} for place, step in ((0, 0), (1, 1), (0, 0))]  # fmt: skip
    (tmp_path / "reference.restart0.rank0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TrainingRunError) as raised:
        read_round(tmp_path / "reference", 0, "uninterrupted run")
    assert str(raised.value) == (
        "the uninterrupted run's rank 0 started more than once (after 2 steps its steps count from 0 again): the "
        "rendezvous completed before every agent joined and again with them; start the agents within its "
        "last_call_timeout (--rdzv-conf)"
    )
