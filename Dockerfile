# Two images from one file:
#   docker build -t llms-gateway .                  the gateway alone (remote providers, remote
#                                                   pool workers; the CPU pool if you add
#                                                   '.[local]'); `--build-arg EXTRAS=ner` adds
#                                                   guardrails' names and places
#   docker build --target gpu -t llms-gateway:gpu . the official vLLM image with the gateway as its
#                                                   entrypoint: the pool spawns `vllm serve` per GPU
#                                                   group (run with --gpus all)

# Pinned: the pool passes vLLM flags (--runner, --reasoning-parser, ...) whose spelling changes
# between releases; move the tag when the fake vllm in tests/ is moved with it.
FROM vllm/vllm-openai:v0.11.0 AS gpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
# Extras to install with the gateway, comma-separated: `--build-arg EXTRAS=ner` for guardrails'
# names and places (`detect: person`, docs/guardrails.md), which the image lacks by default.
ARG EXTRAS=
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" \
    && useradd --system --uid 10001 --create-home gateway
COPY llms.json /etc/llms/llms.json
# Not root, as the other images: the gateway and the vLLM workers it spawns run as `gateway`,
# the weights vLLM downloads and the state (keys, spend, worker logs) in that user's home. A
# volume on the state keeps it across upgrades; one on the cache saves downloading the weights.
RUN install -d -o gateway -g gateway /home/gateway/.cache /home/gateway/state
ENV LLMS_STATE_DIR=/home/gateway/state HF_HOME=/home/gateway/.cache/huggingface
VOLUME /home/gateway/state
USER gateway
# Workers listen on 127.0.0.1:8101+ inside the container; only the gateway's port is published.
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=3)"
# The vLLM image's entrypoint is its own API server: replace it with the gateway.
ENTRYPOINT ["llms-gateway", "serve", "--config", "/etc/llms/llms.json", "--host", "0.0.0.0", \
            "--port", "8000"]
CMD []

# The CPU worker of deploy/compose.yaml: the gateway with its bundled llama.cpp pool (compiled
# here, so the build needs a compiler), serving Gemma 3 270M on :8101.
FROM python:3.11-slim AS cpu-worker
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
RUN pip install --no-cache-dir '.[local]' && useradd --system --uid 10001 --create-home gateway
# compose mounts a volume here (the assembled model): a mount point the image lacks is created
# by Docker as root, and the worker, running as `gateway`, could not write its model there.
RUN install -d -o gateway -g gateway /home/gateway/.cache
USER gateway
EXPOSE 8101
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=30 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8101/ready', timeout=3)"
CMD ["llms-gateway", "serve", "--config", "/etc/llms/worker.json", "--host", "0.0.0.0", \
     "--port", "8101", "--allow-unauthenticated"]

FROM python:3.11-slim AS gateway
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
# As the gpu image's: `--build-arg EXTRAS=ner` adds guardrails' names and places.
ARG EXTRAS=
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" && useradd --system --uid 10001 gateway
COPY llms.json /etc/llms/llms.json
# The state directory (the accounts database when database.url is unset, the pool's worker
# logs) must be the image user's: made here, or the first start cannot write it. A volume, so
# keys and spend outlive the container: `docker run -v llms-state:/home/gateway/state ...`
# keeps them across upgrades. Replicas share PostgreSQL instead (deploy/compose.yaml).
RUN install -d -o gateway -g gateway /home/gateway /home/gateway/state
ENV LLMS_STATE_DIR=/home/gateway/state
VOLUME /home/gateway/state
USER gateway
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=3)"
# Binding 0.0.0.0 needs server.api_keys (e.g. LLMS_GATEWAY_KEY set) or --allow-unauthenticated.
CMD ["llms-gateway", "serve", "--config", "/etc/llms/llms.json", "--host", "0.0.0.0", "--port", "8000"]
