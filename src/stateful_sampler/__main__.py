"""``python -m stateful_sampler``: the ``stateful-sampler`` command."""

import sys

from stateful_sampler.cli import main

sys.exit(main())
