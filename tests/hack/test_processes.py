"""The local cluster's process supervision, with plain processes (no cluster)."""

import sys
import threading
import time
from pathlib import Path

from hack.localcluster.processes import Process, Restarter


def test_a_process_restarted_from_a_thread_outlives_that_thread(tmp_path: Path) -> None:
    """The kernel signals a child when the thread that forked it ends (PR_SET_PDEATHSIG
    is per thread): a component a test's `Restarter` started again died with the
    Restarter at the test's end, and every later test ran without it."""
    process = Process(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log"
    )
    process.start()
    try:
        process.kill()
        restarted = threading.Thread(target=process.start)
        restarted.start()
        restarted.join()
        time.sleep(0.5)  # the signal, had it come, would have come by now

        assert process.alive()
    finally:
        process.kill()


def test_a_restarter_starts_again_what_exits_and_what_it_started_survives_it(
    tmp_path: Path,
) -> None:
    process = Process(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log"
    )
    process.start()
    try:
        with Restarter({"sleeper": process}, ["sleeper"], delay=0.1) as restarter:
            assert process.popen is not None
            process.popen.kill()
            deadline = time.monotonic() + 10
            while restarter.restarts.get("sleeper", 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.5)  # the Restarter's thread has ended

        assert restarter.restarts == {"sleeper": 1}
        assert process.alive()
    finally:
        process.kill()
