"""A process whose wall clock is off, as on a node whose time sync failed: Debian's
libfaketime, preloaded (`hack/test` installs the package `libfaketime`).

Only the wall clock moves (`time.time()`, `datetime.now()`, the time OpenSSL checks a
certificate's dates against); the monotonic clock stays the machine's, as on a real
node, where skew is a matter of wall time. Python processes only: Go reads the clock
through the vDSO, past any preloaded library.
"""

import glob

LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def library() -> str:
    """libfaketime's path; an error naming the package when it is not installed."""
    found = sorted(glob.glob(LIBRARY_GLOB))
    if not found:
        raise RuntimeError(
            f"libfaketime is not installed (no {LIBRARY_GLOB}): install Debian's package "
            "libfaketime (hack/test does)"
        )
    return found[0]


def skewed(offset_seconds: int) -> dict[str, str]:
    """The environment that runs a process with its wall clock `offset_seconds` ahead of
    this machine's (behind when negative)."""
    return {
        "LD_PRELOAD": library(),
        "FAKETIME": f"{offset_seconds:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
