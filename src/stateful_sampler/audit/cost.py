"""What an audit will cost, said before a long one starts, so that nobody waits blind on 10^8.

Measured on 2 shared cores (AMD EPYC), each in a fresh process: ``audit(AuditConfig(size=n),
batch_size=256)`` timed, and its peak RSS above the post-import baseline (``resource.getrusage``'s
``ru_maxrss`` before and after the call):

| occurrences | epochs x size | time | memory |
|---|---|---|---|
| 10^7 | 1 x 10^7 | 9 s | 0.57 GiB |
| 3*10^7 | 1 x 3*10^7 | 20 s | 1.7 GiB |
| 10^8 | 1 x 10^8 | 96 s | 5.4 GiB |

Past a few seconds of fixed cost that is about 1 us and 58 bytes per occurrence.
"""

from __future__ import annotations

SECONDS_PER_OCCURRENCE = 0.96e-6
BYTES_PER_OCCURRENCE = 58
ANNOUNCE_ABOVE = 10**7  # smaller audits finish in about 10 s: no estimate


def estimate(occurrences: int) -> str | None:
    """A one-line estimate of an audit of ``occurrences`` fed samples, or None when it is short."""
    if occurrences <= ANNOUNCE_ABOVE:
        return None
    seconds = occurrences * SECONDS_PER_OCCURRENCE
    gib = occurrences * BYTES_PER_OCCURRENCE / 2**30
    return (
        f"auditing {occurrences:,} occurrences: about {_duration(seconds)} and {gib:.1f} GiB of memory on 2 cores "
        "(fewer epochs per call, with --start-epoch, audit in parts)"
    )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
