"""The config of ``agpo serve`` (``ServeConfig``), which pipelines.ads.serving.serve runs. It imports no mlflow, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_int
from pipelines.ads.serving.score_config import registry_tracking_field
from pipelines.devices import check_device
from pipelines.runs import run_path_field

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServeConfig:
    """A student behind MLflow's scoring server (``mlflow models serve``), on this machine only."""

    model: str = field(
        default="models:/ads-relevance-student@champion",
        metadata={"help": "a registered model (models:/<name>@<alias> or /<version>) or a student folder"},
    )
    tracking_uri: str | None = registry_tracking_field()
    port: int = field(default=5001, metadata={"help": "port on 127.0.0.1"})
    workers: int = field(default=1, metadata={"help": "server worker processes"})
    out_dir: str = run_path_field(
        "serve",
        "where a student folder is written as an MLflow model, or a registered one downloaded and verified, "
        "before serving",
    )
    device: str = field(
        default="cpu",
        metadata={
            "help": "where onnxruntime runs the graph: cpu, cuda or cuda:N (needs onnxruntime-gpu), or auto (the GPU "
            "when torch sees one); a lexical matcher runs on the CPU"
        },
    )

    def __post_init__(self) -> None:
        check_device(self.device)
        require_int("port", self.port, 1)
        require_int("workers", self.workers, 1)
        if self.port > 65535:
            raise ValueError(f"port must be at most 65535, got {self.port}")
