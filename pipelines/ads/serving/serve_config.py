"""The config of ``agpo serve`` (``ServeConfig``), which pipelines.ads.serving.serve runs. It imports no mlflow, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from agpo.checks import require_choice, require_int
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.serving.score_config import registry_tracking_field
from pipelines.devices import check_device
from pipelines.runs import run_path_field
from student.graph_runtimes import BACKENDS as GRAPH_BACKENDS

LOOPBACK = "127.0.0.1"
# the import's cap on a query or ad text (InputConfig.max_text_chars' default): a served pair may be no longer
IMPORT_TEXT_CHARS: int = next(f.default for f in fields(InputConfig) if f.name == "max_text_chars")
SERVE_BACKENDS = (*GRAPH_BACKENDS, "auto")  # a graph's: the served model holds no torch


@dataclass(frozen=True)
class ServeConfig:
    """A student behind the scoring server (pipelines.ads.serving.serve_app), on this machine only.

    Keys in two groups: what is served and where (model, tracking_uri, port, workers, out_dir, device, backend), and
    what one request may ask (max_request_bytes, max_rows, max_text_chars, request_timeout_s, max_concurrency)."""

    model: str = field(
        default="models:/ads-relevance-student@champion",
        metadata={"help": "a registered model (models:/<name>@<alias> or /<version>) or a student folder"},
    )
    tracking_uri: str | None = registry_tracking_field()
    port: int = field(default=5001, metadata={"help": "port on 127.0.0.1"})
    workers: int = field(default=1, metadata={"help": "server worker processes (each loads the model)"})
    out_dir: str = run_path_field(
        "serve",
        "where serving.json says what is served (model, version, files digest, url, limits); the model itself is "
        "downloaded, verified and loaded in a private temporary folder, removed when the server stops",
    )
    device: str = field(
        default="cpu",
        metadata={
            "help": "where onnxruntime runs the graph: cpu, cuda or cuda:N (needs onnxruntime-gpu), or auto (the GPU "
            "when torch sees one); a lexical matcher runs on the CPU"
        },
    )
    backend: str = field(
        default="onnx",
        metadata={
            "help": f"one of {list(SERVE_BACKENDS)}: the graph and runtime the server runs (as agpo score's backend); "
            "auto: the fastest that keeps quality, as agpo distil's serving_backends measured it, else fp32 on openvino"
        },
    )

    # what one request may ask: a larger one is refused before the model sees it
    max_request_bytes: int = field(
        default=2**20,
        metadata={"help": "largest request body in bytes; a larger one is answered 413 before it is read"},
    )
    max_rows: int = field(default=1024, metadata={"help": "most pairs in one request; more are answered 422"})
    max_text_chars: int = field(
        default=IMPORT_TEXT_CHARS,
        metadata={"help": "longest query or ad_title in characters (the import's cap); a longer one is answered 422"},
    )
    request_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "seconds one request may take, reading its body included; past it the answer is 504 and the "
            "model stops working on it after the batch of 64 pairs it is on"
        },
    )
    max_concurrency: int = field(
        default=32,
        metadata={"help": "connections a worker holds at once; more are answered 503 (bounds the bodies in memory)"},
    )

    def __post_init__(self) -> None:
        check_device(self.device)
        require_choice("backend", self.backend, SERVE_BACKENDS)
        require_int("port", self.port, 1)
        require_int("workers", self.workers, 1)
        if self.port > 65535:
            raise ValueError(f"port must be at most 65535, got {self.port}")
        require_int("max_request_bytes", self.max_request_bytes, 64)
        require_int("max_rows", self.max_rows, 1)
        require_int("max_text_chars", self.max_text_chars, 1)
        require_int("max_concurrency", self.max_concurrency, 1)
        timeout = self.request_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
            raise ValueError(f"request_timeout_s must be a number of seconds above 0, got {self.request_timeout_s!r}")
