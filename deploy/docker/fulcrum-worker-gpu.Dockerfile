# Fulcrum GPU worker image: `fulcrum-worker` with the CUDA backend plugin
# (lib/libfulcrum_kernels_cuda.so, dlopen'ed for --device=cuda|auto) on an
# NVIDIA CUDA runtime image (cudart + cuBLAS; the NVIDIA container runtime
# adds the driver). Scheduler and servers need no GPU: they run the CPU image
# (fulcrum.Dockerfile). See deploy/docker/README.md.
#
# Build from the repository root:
#   docker build -f deploy/docker/fulcrum-worker-gpu.Dockerfile -t fulcrum-worker-gpu:dev .
# Other GPUs / CUDA versions (the driver must support the CUDA version):
#   --build-arg CUDA_ARCHITECTURES="80;90" --build-arg CUDA_VERSION=13.0.2

ARG CUDA_VERSION=13.0.2

# The CUDA toolkit (nvcc, headers, cudart, cuBLAS) is taken from NVIDIA's
# devel image: Debian 12 packages CUDA 11.8 only, and the project builds with
# the toolkit under /usr/local/cuda (DESIGN.md, "Dependencies").
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS cuda-toolkit

# ---- builder: Debian 12 build dependencies + the CUDA toolkit ---------------
FROM debian:12 AS builder
ARG CUDA_ARCHITECTURES=90
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN apt-get update \
 && ./scripts/install-deps.sh \
 && rm -rf /var/lib/apt/lists/*
# /usr/local/cuda is a symlink in NVIDIA's image; COPY follows it.
COPY --from=cuda-toolkit /usr/local/cuda/ /usr/local/cuda/
RUN test -x /usr/local/cuda/bin/nvcc
COPY . .
ENV FULCRUM_BUILD_DIR=/build
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFULCRUM_CUDA=ON \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
 && ./scripts/build.sh --target fulcrum fulcrum-worker fulcrum_kernels_cuda \
 && test -f /build/lib/libfulcrum_kernels_cuda.so \
 && mkdir -p /out/bin /out/lib /out/examples /out/datasets \
 && cp /build/bin/fulcrum /build/bin/fulcrum-worker /out/bin/ \
 && cp /build/lib/libfulcrum_kernels_cuda.so /out/lib/ \
 && strip --strip-unneeded /out/bin/* /out/lib/libfulcrum_kernels_cuda.so \
 && LD_LIBRARY_PATH=/usr/local/cuda/lib64 ./deploy/docker/bundle-libs.sh /out/deps \
      /out/bin/fulcrum /out/bin/fulcrum-worker /out/lib/libfulcrum_kernels_cuda.so \
 && cp examples/*.yaml /out/examples/ \
 && cp -r /usr/share/datasets/fashion-mnist /out/datasets/

# ---- runtime: NVIDIA CUDA runtime (cudart, cuBLAS) + the Debian libraries ---
# Ubuntu 24.04's glibc (2.39) and libstdc++ (GCC 14) are newer than Debian
# 12's, so binaries built on Debian 12 run on it; the other libraries come
# from the builder in /opt/fulcrum/deps (ldd-collected, bundle-libs.sh).
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN groupadd --system --gid 10001 fulcrum \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/fulcrum \
      --no-create-home --shell /usr/sbin/nologin fulcrum \
 && mkdir -p /var/lib/fulcrum \
 && chown 10001:10001 /var/lib/fulcrum
COPY --from=builder /out/bin/ /opt/fulcrum/bin/
COPY --from=builder /out/lib/ /opt/fulcrum/lib/
COPY --from=builder /out/deps/ /opt/fulcrum/deps/
COPY --from=builder /out/examples/ /opt/fulcrum/examples/
COPY --from=builder /out/datasets/ /usr/share/datasets/
ENV PATH=/opt/fulcrum/bin:$PATH \
    LD_LIBRARY_PATH=/opt/fulcrum/deps:/usr/local/cuda/lib64:${LD_LIBRARY_PATH} \
    FULCRUM_CUDA_PLUGIN=/opt/fulcrum/lib/libfulcrum_kernels_cuda.so \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Fail the build when a library is missing (libcuda.so.1, the driver, is not
# linked by anything here: cudart loads it at run time).
RUN if ldd /opt/fulcrum/bin/* /opt/fulcrum/lib/*.so | grep 'not found'; then exit 1; fi

USER 10001:10001
WORKDIR /var/lib/fulcrum
EXPOSE 7000 9100
CMD ["fulcrum-worker", "--help"]
