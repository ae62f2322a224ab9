"""verify's LightningCLI runner: the only part of ``stateful_sampler.verify`` that imports Lightning."""
