"""The torchrun launcher's process hygiene, on real processes: a rank dies with its parent, and the
ranks get no Airflow settings and a share of the launcher's threads."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipelines.launch import rank_environment

ROOT = Path(__file__).resolve().parents[2]

# a parent that starts a child which asks to die with it, prints the child's pid, then waits forever
CHILD = (
    "from pipelines.launch import die_with_parent; import time; die_with_parent(); print('armed', flush=True); "
    "time.sleep(300)"
)
PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
import time; time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_rank_dies_when_its_launcher_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_ranks_get_no_airflow_settings_and_share_the_threads(monkeypatch):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:secret@127.0.0.1/airflow")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = rank_environment(processes=2, cuda=False, threads=4)
    assert not [key for key in env if key.startswith("AIRFLOW__")]
    assert env["OMP_NUM_THREADS"] == "2" and env["GLOO_SOCKET_IFNAME"] == "lo" and env["DS_ACCELERATOR"] == "cpu"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    gpu = rank_environment(processes=2, cuda=True, threads=1)
    assert gpu["OMP_NUM_THREADS"] == "1" and "GLOO_SOCKET_IFNAME" not in gpu
