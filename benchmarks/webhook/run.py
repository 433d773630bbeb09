"""Throughput and latency of `POST /mutate` against a bare starlette + uvicorn baseline.

Both servers run in their own subprocess with the same uvicorn settings (one worker,
uvloop, httptools, TLS) and the same certificate, and both are loaded by `wrk` the same
way: the same ~2.6 KB AdmissionReview (a Deployment's pod asking for one GPU), 32
keep-alive connections, 2 threads, the same duration, after the same warm-up.

  (a) baseline: reads the body and returns a canned AdmissionReview response;
  (b) gpupack:  `gpupack-webhook serve`, no cluster, the real decision, JSONPatch,
                metrics and audit line (stdout, sent to /dev/null).

Target: (b) has at least 0.6 of the throughput of (a) and p99 <= 10 ms. The last line of
output is one JSON object with the figures.

Usage: .venv/bin/python benchmarks/webhook/run.py [--duration 10] [--rounds 3]
       .venv/bin/python benchmarks/webhook/run.py --profile /tmp/mutate.prof
"""

import argparse
import datetime
import json
import os
import pstats
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from certs import pem
from webhook.mutate import MutationContext, decide

# Run as a script: make the repository's test builders (the realistic pod) importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from doubles.pods import as_the_api_server_sends_it, review, vllm_pod
from webhook.review import allow, parse_review
from webhook.serve import build_uvicorn_config

TARGET_RATIO: Final = 0.6
TARGET_P99_MS: Final = 10.0
CONNECTIONS: Final = 32
THREADS: Final = 2
RESULT_MARKER: Final = "WRK_RESULT "

LUA_SCRIPT: Final = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%(body)s]==]

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%(marker)s{"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,' ..
    '"max_us":%%d,"errors":%%d,"non_2xx":%%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def admission_review() -> dict[str, Any]:
    """A realistic AdmissionReview: the ReplicaSet controller creating a vLLM pod of a
    Deployment that asks for one GPU, as kube-apiserver sends it (with its service-account
    token volume and managed fields, about 3 KB)."""
    pod = as_the_api_server_sends_it(dict(vllm_pod()), "56q6j")
    return review(pod, uid="b6e1c1d2-0c5a-4f7e-8a52-3f0f8f6d2a91")


# -- the baseline server (runs in its own process: `run.py --serve-baseline ...`) -----------


def serve_baseline(port: int, cert: str, key: str) -> None:
    """A bare starlette endpoint with the webhook's uvicorn settings and a plain TLS context,
    answering every POST with the response gpupack gives for the benchmark's review."""
    review = parse_review(json.dumps(admission_review()).encode())
    decision = decide(review, MutationContext())
    canned = json.dumps(allow(review.uid, list(decision.patch))).encode()

    async def mutate(request: Request) -> Response:
        await request.body()
        return Response(canned, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    app = Starlette(
        routes=[
            Route("/mutate", mutate, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    config = build_uvicorn_config(app, host="127.0.0.1", port=port, ssl_context=context)
    uvicorn.Server(config).run()


# -- the orchestrator ---------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    non_2xx: int

    def as_json(self) -> dict[str, float | int]:
        return {
            "rps": round(self.rps, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "errors": self.errors,
            "non_2xx": self.non_2xx,
        }


def write_certificate(directory: Path) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 from a throwaway CA (EC P-256), from certs/."""
    now = datetime.datetime.now(datetime.UTC)
    ca = pem.new_ca("gpupack benchmark CA", now=now, algorithm=pem.KeyAlgorithm.ECDSA_P256)
    leaf = pem.issue(
        ca,
        "gpupack-webhook-benchmark",
        now=now,
        names=["127.0.0.1"],
        algorithm=pem.KeyAlgorithm.ECDSA_P256,
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(leaf.cert_pem + ca.cert_pem)
    key_path.write_bytes(leaf.key_pem)
    return cert_path, key_path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def https_request(url: str, cafile: Path, body: bytes | None = None) -> bytes:
    context = ssl.create_default_context(cafile=str(cafile))
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, headers=headers)
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        data: bytes = response.read()
        return data


def wait_until_up(url: str, cafile: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before serving {url}")
        try:
            https_request(url, cafile)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the server did not answer {url} within 60 s")


@contextmanager
def running(
    command: list[str], url: str, cafile: Path, home: Path, log_path: Path
) -> Iterator[None]:
    """The server in its own process: no kubeconfig, not in a pod (so no cluster), stdout
    (the audit log) to /dev/null, stderr (its JSON logs) shown only when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.pop("KUBECONFIG", None)
    env["HOME"] = str(home)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_until_up(url, cafile, process)
            yield
        except BaseException:
            print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_wrk(url: str, script: Path, duration: float) -> Figures:
    command = [
        "wrk",
        f"--threads={THREADS}",
        f"--connections={CONNECTIONS}",
        f"--duration={max(1, round(duration))}s",
        "--timeout=5s",
        f"--script={script}",
        url,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next((x for x in output.splitlines() if x.startswith(RESULT_MARKER)), None)
    if line is None:
        raise SystemExit(f"wrk printed no result line:\n{output}")
    raw = json.loads(line[len(RESULT_MARKER) :])
    return Figures(
        rps=raw["requests"] / (raw["duration_us"] / 1e6),
        p50_ms=raw["p50_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        errors=raw["errors"],
        non_2xx=raw["non_2xx"],
    )


def median(figures: list[Figures]) -> Figures:
    return Figures(
        rps=statistics.median(f.rps for f in figures),
        p50_ms=statistics.median(f.p50_ms for f in figures),
        p99_ms=statistics.median(f.p99_ms for f in figures),
        max_ms=max(f.max_ms for f in figures),
        errors=sum(f.errors for f in figures),
        non_2xx=sum(f.non_2xx for f in figures),
    )


def check_answers(base: str, cafile: Path, body: bytes) -> None:
    """Both servers answer the review with an allowing response and a JSONPatch."""
    answer = json.loads(https_request(f"{base}/mutate", cafile, body))["response"]
    if not (answer.get("allowed") and answer.get("patch")):
        raise SystemExit(f"{base}/mutate did not answer with a patch: {answer}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per server")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per server (median)")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="instead of comparing, run gpupack once under cProfile, write the profile to "
        "PATH and print where its time goes (the figures are then not comparable)",
    )
    parser.add_argument("--serve-baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_baseline:
        serve_baseline(args.port, args.cert, args.key)
        return 0
    if shutil.which("wrk") is None:
        print(
            "error: wrk is not installed; install it with `apt-get install -y wrk`",
            file=sys.stderr,
        )
        return 2
    body = json.dumps(admission_review()).encode()
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        cert, key = write_certificate(work)
        script = work / "post.lua"
        script.write_text(LUA_SCRIPT % {"body": body.decode(), "marker": RESULT_MARKER})
        ports = {"baseline": free_port(), "gpupack": free_port()}
        commands = {
            "baseline": [
                *(sys.executable, __file__, "--serve-baseline"),
                *("--port", str(ports["baseline"]), "--cert", str(cert), "--key", str(key)),
            ],
            "gpupack": [
                *(sys.executable, "-m", "webhook.cli", "serve", "--host", "127.0.0.1"),
                *("--port", str(ports["gpupack"]), "--metrics-port", "0"),
                *("--tls-cert-file", str(cert), "--tls-private-key-file", str(key)),
                *("--log-level", "warning"),
            ],
        }
        if args.profile:
            profile = Path(args.profile).resolve()
            command = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(profile),
                *commands["gpupack"][1:],
            ]
            base = f"https://127.0.0.1:{ports['gpupack']}"
            with running(command, f"{base}/healthz", cert, home, work / "profile.log"):
                figures = run_wrk(f"{base}/mutate", script, args.duration)
            pstats.Stats(str(profile), stream=sys.stderr).sort_stats("tottime").print_stats(30)
            print(
                json.dumps(
                    {"benchmark": "webhook-mutate-profile", "profile": str(profile)}
                    | {"gpupack": figures.as_json()}
                )
            )
            return 0
        results: dict[str, list[Figures]] = {"baseline": [], "gpupack": []}
        print(
            f"POST /mutate, {len(body)} byte AdmissionReview, wrk -t{THREADS} -c{CONNECTIONS} "
            f"-d{args.duration:g}s, {args.rounds} round(s), {os.cpu_count()} CPU(s)",
            file=sys.stderr,
        )
        for round_index in range(args.rounds):
            order = ["baseline", "gpupack"] if round_index % 2 == 0 else ["gpupack", "baseline"]
            for name in order:
                base = f"https://127.0.0.1:{ports[name]}"
                log_path = work / f"{name}-{round_index}.log"
                with running(commands[name], f"{base}/healthz", cert, home, log_path):
                    check_answers(base, cert, body)
                    if args.warmup > 0:
                        run_wrk(f"{base}/mutate", script, args.warmup)
                    figures = run_wrk(f"{base}/mutate", script, args.duration)
                results[name].append(figures)
                print(
                    f"  round {round_index + 1} {name:8}: {figures.rps:8.0f} req/s  "
                    f"p50 {figures.p50_ms:6.2f} ms  p99 {figures.p99_ms:6.2f} ms  "
                    f"errors {figures.errors} non-2xx {figures.non_2xx}",
                    file=sys.stderr,
                )
    baseline, gpupack = median(results["baseline"]), median(results["gpupack"])
    ratio = gpupack.rps / baseline.rps if baseline.rps else 0.0
    summary = {
        "benchmark": "webhook-mutate",
        "body_bytes": len(body),
        "connections": CONNECTIONS,
        "threads": THREADS,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "baseline": baseline.as_json(),
        "gpupack": gpupack.as_json(),
        "ratio": round(ratio, 3),
        "target": {"ratio": TARGET_RATIO, "p99_ms": TARGET_P99_MS},
        "meets_target": ratio >= TARGET_RATIO and gpupack.p99_ms <= TARGET_P99_MS,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
