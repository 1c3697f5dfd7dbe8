# One image for the API and the workers. GPU workers need the NVIDIA container runtime;
# torch comes from the CUDA wheel index (the API process never imports it).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LIBREYOLO_HOME=/var/lib/libreyolo \
    LIBREYOLO_ARTIFACT_ROOT=/var/lib/libreyolo/jobs

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md* ./
COPY libreyolo_core ./libreyolo_core
COPY service ./service
COPY worker ./worker
COPY libreyolo_client ./libreyolo_client

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu124
RUN pip install --extra-index-url ${TORCH_INDEX} torch==2.14.1 torchvision==0.29.1 \
    && pip install .

RUN useradd --create-home --uid 1000 libreyolo \
    && mkdir -p /var/lib/libreyolo/jobs \
    && chown -R libreyolo /var/lib/libreyolo
USER libreyolo

EXPOSE 8000
CMD ["libreyolo-service", "serve", "--host", "0.0.0.0", "--port", "8000"]
