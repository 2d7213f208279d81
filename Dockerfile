# pytgi CPU image, with TGI's container conventions:
#   docker run -p 8080:80 -v $volume:/data pytgi-cpu --model-id $model
# entrypoint `text-generation-launcher`, root, port 80 inside (PORT), the hub cache on the /data
# volume (HF_HOME), SIGTERM drains in-flight requests (--graceful-termination-timeout, default 90 s:
# give `docker stop -t 95`). Beyond TGI: a HEALTHCHECK on /health.
# BASE_IMAGE: any Debian bookworm with python3.11 as `python` and `pip` (the default is Docker's);
# TORCH_PIP_ARGS: where torch's CPU wheel comes from; PIP_ARGS: where pytgi's other dependencies
# come from (default PyPI). scripts/build_image_debian.sh builds with no registry and no network for
# pip: a Debian base made by mmdebstrap, every wheel from a local folder mounted into the build.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
ARG PIP_ARGS=""

# g++ builds the CPU kernels below; torch's extension loader also checks the compiler when it loads
# the prebuilt module at start-up, so the compiler stays in the image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data \
    PORT=80 \
    TORCH_EXTENSIONS_DIR=/opt/pytgi/torch_extensions \
    OMP_WAIT_POLICY=PASSIVE \
    TOKENIZERS_PARALLELISM=false

WORKDIR /opt/pytgi/src
# torch's CPU-only wheel first (the default index would pull the CUDA one)
RUN pip install torch==2.13.0 ${TORCH_PIP_ARGS}
COPY pyproject.toml README.md ./
COPY pytgi ./pytgi
RUN pip install ${PIP_ARGS} .

# Build the CPU kernels now, not on the first start: the build directory is keyed by sources,
# flags and torch, and the flags follow the build host's CPU (AVX2/AVX-512). A host with another
# ISA builds its own copy at first start (logged), as a bare install would. The root is passed as
# the server passes it (TORCH_EXTENSIONS_DIR through pytgi.envs): torch's default root ignores it.
RUN python -c "from pytgi import envs; from pytgi.backends.cpu.kernels import load_cpu_kernels as l; \
    assert l(envs.torch_extensions_dir()) is not None"

WORKDIR /data
VOLUME /data
EXPOSE 80
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
    CMD python -c "import os,urllib.request as u; u.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\",\"80\")}/health', timeout=2)" || exit 1

ENTRYPOINT ["text-generation-launcher"]
CMD ["--json-output"]
