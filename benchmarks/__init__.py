"""Benchmarks of stateful-sampler against torch and torchdata (issue 5).

Run ``python -m benchmarks --quick`` (about 4 minutes on 2 shared cores) or ``--full`` (adds 10^8
anchors and 10^9); ``--json FILE`` also writes the results. Every case runs in its own
subprocess so its peak memory is measured above that process's post-import baseline.
``--smoke`` runs every figure at a tiny size in about 30 s (CI: the command cannot rot).
"""
