"""The demo's assets: scikit-learn's digits as a ``StatefulSampler`` datamodule and a tiny classifier.

``python -m stateful_sampler.demo fit --config configs/digits.yaml`` trains them under LightningCLI.
"""
