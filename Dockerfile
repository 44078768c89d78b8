# The gateway alone (remote providers, or OpenAI-compatible servers elsewhere).
FROM python:3.11-slim
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
