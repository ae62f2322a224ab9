"""``python -m stateful_sampler.demo fit --config configs/digits.yaml``: a plain LightningCLI
for configs that name their model and datamodule by ``class_path``.

The saved ``config.yaml`` is overwritten, so resuming in the same directory (adding a config with
``ckpt_path: last``) does not stop at the fresh run's copy.
"""

from lightning.pytorch.cli import LightningCLI

if __name__ == "__main__":
    LightningCLI(save_config_kwargs={"overwrite": True})
