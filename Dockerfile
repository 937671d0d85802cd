# syntax=docker/dockerfile:1
# One image for every RelayGR service; the command picks the service:
#   docker run relaygr:0.1.0-cpu services.ranker --help
#   (services.router, services.trigger, services.retrieval_stub, services.launcher, services.loadgen)
#
# Variants (deploy/overlays pick them by tag):
#   CPU (default):  docker build -t relaygr:0.1.0-cpu .
#   NVIDIA CUDA:    docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     -t relaygr:0.1.0-cuda .
#   Ascend NPU:     docker build --target ascend --build-arg BASE_IMAGE=<a CANN image with Python 3.11> \
#                     --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t relaygr:0.1.0-ascend .
#                   torch_npu pins the torch release it supports; set TORCH_VERSION to match it.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/relaygr/bin:$PATH
RUN python -m venv /opt/relaygr
# torch first, from the index of the wanted build (CPU, a CUDA version, or PyPI), so that installing the
# project finds its torch requirement met instead of pulling PyPI's default build.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY services/ services/
# Dependencies (grpcio-tools among them) first, then the stubs generated from protos/ as `make proto`
# does, then the project again so that its installed copy includes them.
RUN pip install . \
 && python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/relaygr/v1/*.proto \
 && touch relaygr/__init__.py relaygr/v1/__init__.py \
 && pip install --no-deps --force-reinstall . \
 && python -c "import relaygr.v1.ranker_pb2_grpc, services.ranker.config"

FROM build AS build-ascend
RUN pip install ".[ascend]"

FROM ${BASE_IMAGE} AS runtime-base
# A fixed numeric non-root user, so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 relaygr \
 && useradd --system --uid 10001 --gid relaygr --no-create-home --home-dir /tmp --shell /usr/sbin/nologin relaygr
ENV PATH=/opt/relaygr/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
# gRPC ports of router, ranker, trigger, retrieval stub; their Prometheus metrics ports.
EXPOSE 50050 50051 50052 50053 9100 9101 9102 9103
ENTRYPOINT ["python", "-m"]
CMD ["services.ranker", "--help"]

FROM runtime-base AS ascend
COPY --from=build-ascend /opt/relaygr /opt/relaygr
USER 10001:10001

# The default target: CPU, or CUDA when built with a CUDA torch index.
FROM runtime-base AS runtime
COPY --from=build /opt/relaygr /opt/relaygr
USER 10001:10001
