# Fulcrum, CPU image: the scheduler, the parameter server, the worker (CPU
# backend, OpenBLAS) and the `fulcrum` CLI in one image. The role is chosen by
# the command (`fulcrum-scheduler`, `fulcrum-server`, `fulcrum-worker`); the
# Kubernetes manifests in deploy/k8s set it. See deploy/docker/README.md.
#
# Build from the repository root:
#   docker build -f deploy/docker/fulcrum.Dockerfile -t fulcrum:dev .

# ---- builder: Debian 12 with the build dependencies, Release build ---------
FROM debian:12 AS builder
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The dependency layer only changes when the package list does.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN apt-get update \
 && ./scripts/install-deps.sh \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# A build folder of its own: a build/ copied from a checkout (absolute paths
# in its CMake cache) is never reused. No CUDA toolkit here: the CUDA plugin
# is the GPU image's business (fulcrum-worker-gpu.Dockerfile).
ENV FULCRUM_BUILD_DIR=/build
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULCRUM_CUDA=OFF \
 && ./scripts/build.sh --target fulcrum fulcrum-scheduler fulcrum-server fulcrum-worker \
 && mkdir -p /out/bin /out/examples \
 && cp /build/bin/fulcrum /build/bin/fulcrum-scheduler /build/bin/fulcrum-server \
       /build/bin/fulcrum-worker /out/bin/ \
 && strip --strip-unneeded /out/bin/* \
 && cp examples/*.yaml /out/examples/

# ---- runtime: Debian 12 slim with the shared libraries the binaries use ----
# (ldd build/bin/* | dpkg -S): gRPC, Protocol Buffers, Abseil, prometheus-cpp
# (civetweb), yaml-cpp, OpenBLAS (worker), RocksDB's compression libraries
# (RocksDB itself is linked statically), OpenSSL, c-ares, re2, zlib.
FROM debian:12-slim
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates \
      libabsl20220623 \
      libbz2-1.0 \
      libc-ares2 \
      libcivetweb1 \
      libgrpc++1.51 \
      libgrpc29 \
      liblz4-1 \
      libopenblas0-pthread \
      libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 \
      libprotobuf32 \
      libre2-9 \
      libsnappy1v5 \
      libssl3 \
      libyaml-cpp0.7 \
      libzstd1 \
      zlib1g \
      dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
# dataset-fashion-mnist: /usr/share/datasets/fashion-mnist, the default
# `data.path` of FASHION_MNIST jobs (every worker reads it).

# An unprivileged user with a fixed uid/gid (the manifests' runAsUser/fsGroup).
RUN groupadd --system --gid 10001 fulcrum \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/fulcrum \
      --no-create-home --shell /usr/sbin/nologin fulcrum \
 && mkdir -p /var/lib/fulcrum \
 && chown 10001:10001 /var/lib/fulcrum

COPY --from=builder /out/ /opt/fulcrum/
ENV PATH=/opt/fulcrum/bin:$PATH
# Fail the build, not the pod, when a shared library is missing.
RUN if ldd /opt/fulcrum/bin/* | grep 'not found'; then exit 1; fi

USER 10001:10001
WORKDIR /var/lib/fulcrum
# gRPC and Prometheus ports the manifests use (the binaries default to 0 = a
# free port; pass --port/--metrics-port).
EXPOSE 7000 9100
CMD ["fulcrum", "help"]
