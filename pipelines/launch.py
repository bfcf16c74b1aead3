"""Run a stage under torchrun with several processes, from inside a task or a command.

The stage's resolved config is written to ``<out_dir>/launch/<stage>.yaml`` and
``python -m torch.distributed.run --nproc_per_node N -m pipelines.cli <stage> --config FILE`` runs it on
this machine: the ranks rendezvous on 127.0.0.1 at a free port, use NCCL on GPUs and gloo on CPU
(DeepSpeed's CPU accelerator), and split the cores between them. The ranks' output streams into this
process's output (the Airflow task log); a failed rank fails the stage with the end of that output, and
stopping this process stops the ranks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import yaml

from pipelines.config import to_dict

UNDER_TORCHRUN = "LOCAL_RANK"  # set by torchrun in every rank


def under_torchrun() -> bool:
    return UNDER_TORCHRUN in os.environ


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(stage: str, config: Any, processes: int, out_dir: Path) -> None:
    """Run ``agpo <stage>`` with ``config`` as ``processes`` torchrun ranks; raise if any rank fails."""
    import torch

    config_file = out_dir / "launch" / f"{stage}.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
               "-m", "pipelines.cli", stage, "--config", str(config_file)]  # fmt: skip
    print(f"{stage}: launching {processes} processes: {' '.join(command)}", flush=True)
    last = deque(maxlen=40)
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as ranks:
        try:
            for line in ranks.stdout:
                print(line, end="", flush=True)
                last.append(line)
        finally:  # this process is stopping (a failed or killed task): stop the ranks with it
            if ranks.poll() is None:
                ranks.terminate()
                try:
                    ranks.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    ranks.kill()
    if ranks.returncode:
        raise RuntimeError(
            f"{stage} under torchrun ({processes} processes) failed with exit code {ranks.returncode}; "
            f"the end of its output:\n{''.join(last)}"
        )
