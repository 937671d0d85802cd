# syntax=docker/dockerfile:1
# One image per accelerator, each running every RelayGR service; the command picks the service:
#   docker run relaygr:0.1.0-cpu services.ranker --help
#   (services.router, services.trigger, services.retrieval_stub, services.launcher, services.loadgen)
#
# One command per image (deploy/overlays pick them by tag); the target is the accelerator:
#   CPU:         docker build --target cpu -t relaygr:0.1.0-cpu .
#   NVIDIA CUDA: docker build --target cuda -t relaygr:0.1.0-cuda .
#   Ascend NPU:  docker build --target ascend --build-arg BASE_IMAGE=<a CANN image with Python 3.11> -t relaygr:0.1.0-ascend .
#
# The build arguments decide what each image holds; nothing installed after them replaces it (the project
# itself asks only for torch>=2.4), and the build fails when the image's torch is not the one they name.
# Their defaults are the releases pyproject.toml's cpu, cuda and ascend extras pin:
#   TORCH_VERSION      torch, in every image
#   TORCH_CUDA         the CUDA build of torch in the cuda image (cu126, cu128, ...): PyTorch's index of it
#   TORCH_NPU_VERSION  torch_npu in the ascend image, over torch's CPU build: the release built for TORCH_VERSION
#   TORCH_INDEX        PyTorch's wheel index; <index>/cpu and <index>/<TORCH_CUDA> hold the builds
#   BASE_IMAGE         the Python 3.11 image the image is built on and runs in
# Stages an image does not need are skipped (BuildKit, Docker's builder since 23.0).

ARG BASE_IMAGE=python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl
ARG TORCH_VERSION=2.13.0

FROM ${BASE_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/relaygr/bin:$PATH
RUN python -m venv /opt/relaygr

# The project as a wheel that includes the stubs generated from protos/ as `make proto` does (with the
# grpcio-tools release pyproject.toml pins). It brings no torch: each image installs it over its own.
FROM venv AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY services/ services/
RUN pip install "$(grep -o 'grpcio-tools==[0-9.]*' pyproject.toml)" \
 && python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/relaygr/v1/*.proto \
 && touch relaygr/__init__.py relaygr/v1/__init__.py \
 && pip wheel --no-deps --wheel-dir /wheels .

FROM venv AS venv-cpu
ARG TORCH_INDEX
ARG TORCH_VERSION
RUN pip install --index-url "${TORCH_INDEX}/cpu" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/*.whl \
 && python -c "import relaygr.v1.ranker_pb2_grpc, services.ranker.config, torch; v = torch.__version__; assert v.split('+')[0] == '${TORCH_VERSION}' and torch.version.cuda is None, f'torch {v} is not the CPU build of ${TORCH_VERSION}'"

# CUDA: the wheels bring the CUDA runtime; the node's NVIDIA driver does the rest.
FROM venv AS venv-cuda
ARG TORCH_INDEX
ARG TORCH_VERSION
ARG TORCH_CUDA=cu128
RUN pip install --index-url "${TORCH_INDEX}/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/*.whl \
 && python -c "import relaygr.v1.ranker_pb2_grpc, services.ranker.config, torch; v = torch.__version__; assert v.split('+')[0] == '${TORCH_VERSION}' and torch.version.cuda, f'torch {v} is not the ${TORCH_CUDA} build of ${TORCH_VERSION}'"

# Ascend: torch_npu runs over torch's CPU build, and each torch_npu release is built for one torch release.
FROM venv-cpu AS venv-ascend
ARG TORCH_VERSION
ARG TORCH_NPU_VERSION=2.13.0
RUN pip install "torch_npu==${TORCH_NPU_VERSION}" \
 && python -c "import importlib.metadata as m, torch; v, npu = torch.__version__, m.version('torch_npu'); assert v.split('+')[0] == '${TORCH_VERSION}' and npu == '${TORCH_NPU_VERSION}', f'torch {v} with torch_npu {npu}, not ${TORCH_VERSION} with ${TORCH_NPU_VERSION}'"

FROM ${BASE_IMAGE} AS runtime
# A fixed numeric non-root user, so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 relaygr \
 && useradd --system --uid 10001 --gid relaygr --no-create-home --home-dir /tmp --shell /usr/sbin/nologin relaygr
ENV PATH=/opt/relaygr/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
# gRPC ports of router, ranker, trigger, retrieval stub; their plaintext health ports; their Prometheus
# metrics ports.
EXPOSE 50050 50051 50052 50053 50060 50061 50062 50063 9100 9101 9102 9103
ENTRYPOINT ["python", "-m"]
CMD ["services.ranker", "--help"]
USER 10001:10001

FROM runtime AS ascend
COPY --from=venv-ascend /opt/relaygr /opt/relaygr

FROM runtime AS cuda
COPY --from=venv-cuda /opt/relaygr /opt/relaygr

# The default target (the last stage).
FROM runtime AS cpu
COPY --from=venv-cpu /opt/relaygr /opt/relaygr
