"""Hostile clients against a real `gpupack-webhook serve` process, and its memory.

What anything in the cluster network can do to the webhook's port: send endless
headers, trickle a request, open TLS connections and leave them idle.
"""

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from hack.localcluster.processes import free_port

from .conftest import CertificateAuthority


@dataclass(frozen=True)
class Served:
    process: "subprocess.Popen[str]"
    port: int
    client: ssl.SSLContext

    def rss_mib(self) -> float:
        """Resident memory of the server process."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def connect(self, timeout: float = 10) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.client.wrap_socket(raw, server_hostname="127.0.0.1")

    def healthy(self) -> bool:
        with httpx.Client(verify=self.client, timeout=10) as client:
            return client.get(f"https://127.0.0.1:{self.port}/healthz").status_code == 200


def serve_command(*args: str) -> list[str]:
    """`gpupack-webhook serve` with `args`, run from this interpreter."""
    return [sys.executable, "-m", "webhook.cli", "serve", *args]


def no_cluster_env() -> dict[str, str]:
    """No kubeconfig and not in a pod: the webhook runs without a cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.pop("KUBECONFIG", None)
    env["HOME"] = "/nonexistent"  # no ~/.kube/config either
    return env


@contextmanager
def serve(tmp: Path, *args: str) -> Iterator[Served]:
    """`gpupack-webhook serve` without a cluster on a free port, ready."""
    ca = CertificateAuthority()
    ca.issue().write(tmp / "tls.crt", tmp / "tls.key")
    port = free_port()
    env = no_cluster_env()
    command = serve_command("--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0")
    command += ["--log-level", "error", "--tls-cert-file", str(tmp / "tls.crt")]
    command += ["--tls-private-key-file", str(tmp / "tls.key"), *args]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    served = Served(process, port, ca.client_context())
    try:
        for _ in range(600):
            try:
                if served.healthy():
                    break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.05)
        yield served
    finally:
        process.terminate()
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def endless_headers(served: Served, count: int, size: int) -> str:
    """One request with `count` headers of `size` bytes each; what the server answered
    (its status line), or how the connection ended."""
    value = b"x" * size
    try:
        with served.connect(timeout=30) as conn:
            conn.sendall(b"POST /mutate HTTP/1.1\r\nhost: webhook\r\n")
            for index in range(count):
                conn.sendall(b"x-filler-%d: %s\r\n" % (index, value))
            conn.sendall(b"content-length: 2\r\n\r\n{}")
            answer = conn.recv(4096)
    except (ConnectionError, ssl.SSLError, TimeoutError, OSError) as error:
        return f"closed: {type(error).__name__}"
    return answer.split(b"\r\n", 1)[0].decode() if answer else "closed: EOF"


def idle_connections(served: Served, count: int) -> list[ssl.SSLSocket]:
    """`count` TLS connections, handshaken and left idle; the caller closes them."""
    return [served.connect() for _ in range(count)]


def closed_by_server(conn: ssl.SSLSocket, within: float) -> bool:
    """Whether the server closes `conn` within `within` seconds (what it still sends
    before closing is read and dropped)."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if conn.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True
    return False


def tcp_closed_by_server(conn: ssl.SSLSocket, within: float) -> bool:
    """Whether the server drops the TCP connection under `conn` within `within` seconds,
    not only its TLS session (a close_notify, after which `recv` answers b""): what the
    kernel, a load balancer and the server's connection limit count. The client sends no
    close_notify of its own, as a hostile one would not."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if socket.socket.recv(conn, 4096) == b"":  # the raw bytes under TLS
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def read_response(conn: ssl.SSLSocket) -> bytes:
    """One whole HTTP response (headers and a Content-Length body) from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
