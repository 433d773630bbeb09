"""A stand-in for `nvidia-cuda-mps-control`, for tests on machines without a GPU.

It speaks the part of the real binary's interface that gpupack uses: `-f` runs the
control daemon in the foreground (here: a unix socket named `control` in
`$CUDA_MPS_PIPE_DIRECTORY` and a `control.log` in `$CUDA_MPS_LOG_DIRECTORY`); without
arguments it is a client that sends each line of stdin to the daemon and prints the
answers, and fails with the real binary's message when no daemon runs. `quit` stops the
daemon. `STANDIN_CRASH_AFTER=n` makes the daemon die (status 3) after n commands.
"""

import os
import socket
import sys
from pathlib import Path

ANSWERS = {"get_default_active_thread_percentage": "100.0", "get_server_list": ""}


def _socket_path() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control"


def daemon() -> int:
    log_path = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    path = _socket_path()
    crash_after = int(os.environ.get("STANDIN_CRASH_AFTER", "0"))
    with (log_path / "control.log").open("a", buffering=1) as log:
        log.write("[stand-in] control daemon started\n")
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.listen()
        served = 0
        while True:
            connection, _ = server.accept()
            with connection:
                command = connection.recv(4096).decode().strip()
                log.write(f"[stand-in] {command}\n")
                if command == "quit":
                    path.unlink(missing_ok=True)
                    log.write("[stand-in] control daemon stopped\n")
                    return 0
                connection.sendall(ANSWERS.get(command, f"unknown command {command}").encode())
            served += 1
            if crash_after and served >= crash_after:
                log.write("[stand-in] fatal: the control daemon crashed\n")
                os._exit(3)


def client() -> int:
    path = _socket_path()
    if not path.exists():
        print("Cannot find MPS control daemon process")
        return 1
    for line in sys.stdin:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(path))
            connection.sendall(line.encode())
            answer = connection.recv(4096).decode()
        if answer:
            print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:] == ["-f"] else client())
