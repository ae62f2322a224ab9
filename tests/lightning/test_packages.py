"""One ``SamplerCheckpoint`` implementation, two Lightning packages: each ``Trainer`` takes its own
package's callback, and each room imports only the framework it integrates. (The callback tests
themselves run under both packages: ``STATEFUL_SAMPLER_TEST_PACKAGE``, see ``lightning_harness``.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import pytorch_lightning
from lightning import pytorch as lightning_pytorch

from stateful_sampler import lightning as for_lightning
from stateful_sampler import pytorch_lightning as for_classic
from stateful_sampler.lightning.restart import complete_saved_batch


@pytest.mark.parametrize(
    ("package", "ours", "other"),
    [
        (pytorch_lightning, for_classic.SamplerCheckpoint, for_lightning.SamplerCheckpoint),
        (lightning_pytorch, for_lightning.SamplerCheckpoint, for_classic.SamplerCheckpoint),
    ],
    ids=["pytorch_lightning", "lightning.pytorch"],
)
def test_each_packages_sampler_checkpoint_is_a_callback_of_that_package_only(
    package: object, ours: type, other: type
) -> None:
    # What type-checked paths (LightningCLI's trainer.callbacks, is_overridden's parent) ask of a callback.
    assert isinstance(ours(), package.Callback)
    assert not isinstance(other(), package.Callback)
    trainer = package.Trainer(accelerator="cpu", callbacks=[ours()], logger=False, enable_progress_bar=False)
    assert [type(callback) for callback in trainer.callbacks if isinstance(callback, ours)] == [ours]


def test_both_callbacks_share_one_implementation_and_one_checkpoint_key() -> None:
    assert for_classic.SamplerCheckpoint.__mro__[1] is for_lightning.SamplerCheckpoint.__mro__[1]
    assert (
        for_classic.SamplerCheckpoint().state_key == for_lightning.SamplerCheckpoint().state_key == "SamplerCheckpoint"
    )
    assert for_classic.SamplerSetupError is for_lightning.SamplerSetupError


@pytest.mark.slow  # fresh interpreters, one per import
def test_the_verify_core_and_the_classic_callback_import_no_lightning() -> None:
    program = (
        "import sys\n"
        "import stateful_sampler.pytorch_lightning, stateful_sampler.lightning, stateful_sampler.testing\n"
        "import stateful_sampler.verify.cli, stateful_sampler.verify.command, stateful_sampler.verify.guard\n"
        "print(sorted(name for name in sys.modules if name == 'lightning' or name.startswith('lightning.')))\n"
    )
    imported = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert imported.stdout == "[]\n"


def _progress(ready: int, completed: int, processed: int) -> dict[str, int]:
    return {"ready": ready, "started": ready, "processed": processed, "completed": completed}


@pytest.mark.parametrize("is_last_batch", [False, True], ids=["mid-epoch", "last-batch"])
def test_for_lightning_before_2_5_a_batch_saved_after_counts_as_completed(is_last_batch: bool) -> None:
    # What ModelCheckpoint writes in on_train_batch_end of batch 3 (of 3 when it is the last):
    # processed 3, completed 2. Lightning < 2.5 would restart at completed and run index 2 again.
    checkpoint = {"loops": {"fit_loop": {
        "epoch_loop.batch_progress": {"total": _progress(3, 2, 3), "current": _progress(3, 2, 3),
                                      "is_last_batch": is_last_batch},
        "epoch_progress": {"total": _progress(1, 0, 0), "current": _progress(1, 0, 0)},
    }}}  # fmt: skip
    complete_saved_batch(checkpoint)
    loop = checkpoint["loops"]["fit_loop"]
    assert loop["epoch_loop.batch_progress"]["current"] == _progress(3, 3, 3)
    assert loop["epoch_loop.batch_progress"]["total"] == _progress(3, 3, 3)
    epoch = _progress(1, 1, 1) if is_last_batch else _progress(1, 0, 0)  # a finished epoch is over, as 2.5 counts
    assert loop["epoch_progress"]["current"] == loop["epoch_progress"]["total"] == epoch
    complete_saved_batch(checkpoint)  # a completed batch is left as it is
    assert loop["epoch_loop.batch_progress"]["current"] == _progress(3, 3, 3)
