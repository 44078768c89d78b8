# Two images from one file:
#   docker build -t llms-gateway .                  the gateway alone (remote providers, remote
#                                                   pool workers; the CPU pool if you add
#                                                   '.[local]')
#   docker build --target gpu -t llms-gateway:gpu . the official vLLM image with the gateway as its
#                                                   entrypoint: the pool spawns `vllm serve` per GPU
#                                                   group (run with --gpus all)

FROM vllm/vllm-openai:latest AS gpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
RUN pip install --no-cache-dir .
COPY llms.json /etc/llms/llms.json
# Workers listen on 127.0.0.1:8101+ inside the container; only the gateway's port is published.
EXPOSE 8000
# The vLLM image's entrypoint is its own API server: replace it with the gateway.
ENTRYPOINT ["llms-gateway", "serve", "--config", "/etc/llms/llms.json", "--host", "0.0.0.0", \
            "--port", "8000"]
CMD []

FROM python:3.11-slim AS gateway
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY providers providers
RUN pip install --no-cache-dir . && useradd --system --uid 10001 gateway
COPY llms.json /etc/llms/llms.json
USER gateway
EXPOSE 8000
# Binding 0.0.0.0 needs server.api_keys (e.g. LLMS_GATEWAY_KEY set) or --allow-unauthenticated.
CMD ["llms-gateway", "serve", "--config", "/etc/llms/llms.json", "--host", "0.0.0.0", "--port", "8000"]
