# One image for every gpupack command (the console scripts of pyproject.toml: the
# components, the node's drivers and daemon, the CRD hook) and the memory shim the node's
# CSI driver hands to pods
# (/opt/gpupack/lib/libgpupack-cuda.so). Build: docker build -t gpupack:dev .
# CI builds this same file without Docker (hack/lib/image.sh: buildah, on a Python base made
# from Debian's packages and passed as PYTHON_IMAGE).
# The build stage makes gpupack's wheel, the shim stage compiles the memory shim (C, glibc
# only); the final stage installs the locked runtime dependencies
# (hack/requirements.lock, hashes checked) and that wheel into a virtualenv, copies the
# shim, carries no compiler and no pip cache, and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# A virtualenv, so the base's own Python stays untouched (PEP 668 bases refuse pip).
RUN python -m venv /build && /build/bin/pip install --no-cache-dir --upgrade pip==24.3.1
COPY pyproject.toml README.md ./
COPY gpupack gpupack
COPY webhook webhook
COPY scheduler scheduler
COPY recommender recommender
COPY exporter exporter
COPY node node
COPY ops ops
COPY certs certs
RUN /build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS shim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY cuda-shim /src/cuda-shim
RUN gcc $(cat /src/cuda-shim/build-flags) -Wall -Wextra -Werror \
      -o /libgpupack-cuda.so /src/cuda-shim/*.c -ldl -lpthread \
 && chmod 0644 /libgpupack-cuda.so

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 65532 gpupack \
 && useradd --system --uid 65532 --gid gpupack --no-create-home --shell /usr/sbin/nologin gpupack
COPY hack/requirements.lock /tmp/requirements.lock
COPY --from=build /wheels /wheels
COPY --from=shim /libgpupack-cuda.so /opt/gpupack/lib/libgpupack-cuda.so
RUN python -m venv /opt/gpupack \
 && /opt/gpupack/bin/pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock \
 && /opt/gpupack/bin/pip install --no-cache-dir --no-index --no-deps /wheels/*.whl \
 && rm -rf /wheels /tmp/requirements.lock
ENV PATH=/opt/gpupack/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT []
CMD ["gpupack-webhook", "--help"]
