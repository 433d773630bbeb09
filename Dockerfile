# One image for every gpupack entrypoint (gpupack-webhook, gpupack-scheduler,
# gpupack-certs, gpupack-exporter, gpupack-mps-csi, gpupack-mps-daemon,
# gpupack-recommender). Build: docker build -t gpupack:dev .
# The build stage makes wheels; the final stage installs them into a virtualenv and
# carries no compiler, no pip cache, and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip==24.3.1 build==1.2.2
COPY pyproject.toml README.md ./
COPY gpupack gpupack
COPY webhook webhook
COPY scheduler scheduler
COPY recommender recommender
COPY exporter exporter
COPY certs certs
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 65532 gpupack \
 && useradd --system --uid 65532 --gid gpupack --no-create-home --shell /usr/sbin/nologin gpupack
COPY --from=build /wheels /wheels
RUN python -m venv /opt/gpupack \
 && /opt/gpupack/bin/pip install --no-cache-dir --no-index --find-links /wheels gpupack \
 && rm -rf /wheels
ENV PATH=/opt/gpupack/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT []
CMD ["gpupack-webhook", "--help"]
