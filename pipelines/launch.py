"""Run a stage under torchrun with several processes, from inside a task or a command.

The stage's resolved config is written to ``<out_dir>/launch/<stage>.yaml`` and
``python -m torch.distributed.run --nproc_per_node N -m pipelines.cli <stage> --config FILE`` runs it on
this machine: the ranks rendezvous at 127.0.0.1 on a free port, use NCCL on GPUs and gloo over the
loopback interface on CPU (DeepSpeed's CPU accelerator), and share this process's cores. Their output
streams into this process's output (the Airflow task log), and a failed rank fails the stage with the end
of that output. Airflow's settings (``AIRFLOW__*``, which hold the deployment's database URI) are not
passed to the ranks.

The ranks die with their launcher: torchrun, and each rank, ask the kernel for SIGKILL when their parent
dies (``PR_SET_PDEATHSIG``). torchrun starts every rank in a session of its own, so without this a killed
task or a lost worker would leave ranks training on, writing into the folder the retry trains in.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import yaml

from pipelines.config import to_dict
from pipelines.threads import WAIT_POLICY

LOG = logging.getLogger(__name__)

UNDER_TORCHRUN = "LOCAL_RANK"  # set by torchrun in every rank
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def under_torchrun() -> bool:
    return UNDER_TORCHRUN in os.environ


# resolved once, before any fork: a child between fork and exec must not load libraries
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    if _PRCTL is None:
        return
    parent = os.getppid()
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent or parent == 1:  # the parent died already: the request will never fire
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environment(processes: int, cuda: bool, threads: int) -> dict[str, str]:
    """This environment for the ranks: no Airflow settings, the stage's ``threads`` split between them (each rank
    runs with its share: pipelines.threads reads OMP_NUM_THREADS), OpenMP's passive wait policy (the ranks share
    the CPUs), and on CPU gloo (DeepSpeed's CPU accelerator) on the loopback interface."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__")}
    env["OMP_NUM_THREADS"] = str(max(1, threads // processes))
    env.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    if not cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def torchrun(stage: str, config: Any, processes: int, out_dir: Path, threads: int) -> None:
    """Run ``agpo <stage>`` with ``config`` as ``processes`` torchrun ranks sharing ``threads``; raise if any rank
    fails."""
    import torch

    config_file = out_dir / "launch" / f"{stage}.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "pipelines.cli",
        stage,
        "--config",
        str(config_file),
    ]
    LOG.info("%s: launching %d processes: %s", stage, processes, " ".join(command))
    last = deque(maxlen=40)
    env = rank_environment(processes, torch.cuda.is_available(), threads)
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=die_with_parent,
    ) as ranks:
        try:
            for line in ranks.stdout:
                print(line, end="", flush=True)
                last.append(line)
            ranks.wait()
        finally:  # stopped early (an exception here): stop the ranks with us
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
