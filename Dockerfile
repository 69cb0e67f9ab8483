# The gateway image. CPU torch by default; for CUDA build with --build-arg TORCH_INDEX=cu124
# style indexes of your own mirror (no model hub is used at run time: models are mounted).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8000
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY policies policies
COPY models_registry models_registry
COPY migrations migrations
COPY alembic.ini ./
RUN pip install --no-cache-dir torch==2.13.0 && pip install --no-cache-dir .
# An unprivileged user (deploy/ runs the pods as uid 10001); var/ holds local state only.
RUN useradd --uid 10001 --no-create-home gateway && mkdir -p /app/var && chown gateway /app/var
USER 10001
EXPOSE 8000
CMD ["python", "-m", "gateway"]
