"""How many CPU threads a stage gives torch and onnxruntime, and OpenMP's wait policy.

The rule, in order:

1. the stage's ``threads`` config key (a pipeline run passes its own ``threads`` to every stage that leaves it
   null), except in a torchrun rank, which runs with the share its launcher put in ``OMP_NUM_THREADS``;
2. else ``OMP_NUM_THREADS`` from the environment: what a deployment gives each worker
   (``deploy/airflow_services.py``) or torchrun each rank (``pipelines/launch.py``);
3. else the CPUs this process may use divided by the task slots it shares them with, at least 1.

The CPUs this process may use are the fewer of its affinity mask (``taskset``, a cpuset) and its cgroup CPU quota
(``cpu.max`` on cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us`` on v1, rounded down, at least 1), never more
than the machine's cores. A container limited with ``--cpus 2`` on a 64-core host sees 64 cores and a quota of
2: torch's default of one thread per core would run 64 threads in 2 CPUs of time. Without a quota, the CPUs of
its affinity that other processes keep busy when the stage starts (``/proc/stat`` over a quarter second; a CPU
counts as taken at 0.75 busy) are left to them: a torch op splits its work evenly across its threads and waits
for the slowest, so a thread that shares its core with another process holds up the whole op (measured: the
MiniLM student's batch took 2.0x as long beside one busy process with 2 threads on 2 cores, 1.5x with 1).
Under a quota the host's load is not this process's to count: the quota is what it gets.

The slots are how many copies of this work share those CPUs: each DAG's task sets ``AGPO_TASK_SLOTS``
(``prepare_airflow_task``, before it imports the pipeline) to the instances of its task that may run at once on
the worker: the mapped count capped by the task's ``max_active_tis_per_dag`` / ``_per_dagrun`` and the
executor's parallelism. Pools are not counted: a pool limits how many tasks run, not which CPUs they share.
Outside Airflow the slots are 1 unless ``AGPO_TASK_SLOTS`` says otherwise.

The wait policy: ``OMP_WAIT_POLICY=PASSIVE`` when the process shares its CPUs as it starts (more than one task
slot, or CPUs other processes keep busy), libgomp's default otherwise; an environment that sets one keeps it. It
has to be in the environment before torch loads libgomp, so entry points call ``prepare_openmp()`` before
importing torch. Passive threads sleep at a barrier instead of spinning on the core that the thread they wait for
(or another process) needs; but waking a sleeping thread on an idle virtual CPU is slow, so on a quiet machine
passive made small ops up to 2x slower (the demo's student distillation 51 s -> 77 s) while libgomp's default
(spin about 3 ms, then sleep) costs nothing there. The measurements are in ``benchmarks/bench_contention.py`` and the
docs/operations.md's "Shared machines".
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TASK_SLOTS_ENV = "AGPO_TASK_SLOTS"
WAIT_POLICY = "PASSIVE"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this process may use: its affinity, its cgroup quota (None: none), the machine's cores and the CPUs
    of its affinity that other processes were using (counted only without a quota)."""

    affinity: int
    quota: float | None
    cores: int
    busy: float = 0.0

    @property
    def taken(self) -> int:
        return 0 if self.quota is not None else math.floor(self.busy + 0.25)

    @property
    def usable(self) -> int:
        quota = self.cores if self.quota is None else max(1, math.floor(self.quota))
        return max(1, min(self.affinity, quota, self.cores) - self.taken)

    def describe(self) -> str:
        quota = "no cgroup quota" if self.quota is None else f"cgroup quota {self.quota:g}"
        taken = f", {self.taken} busy with other processes" if self.taken else ""
        return f"{self.usable} usable CPUs: affinity {self.affinity}, {quota}, {self.cores} cores{taken}"


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a stage uses and why."""

    threads: int
    source: str

    def describe(self) -> str:
        return f"{self.threads} ({self.source})"

    def params(self) -> dict[str, object]:
        """For MLflow: the count and the rule that chose it."""
        return {"threads": self.threads, "threads_source": self.source}


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2 ``cpu.max``, else v1 ``cfs_quota_us / cfs_period_us``);
    None when there is none or it cannot be read."""
    for folder in _cgroup_folders(root, proc_cgroup):
        v2 = _read(folder / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            return None if quota == "max" else _ratio(quota, period or "100000")
        v1 = _read(folder / "cpu.cfs_quota_us")
        if v1 is not None:
            period = _read(folder / "cpu.cfs_period_us") or "100000"
            return None if v1.strip() == "-1" else _ratio(v1, period)
    return None


def _cgroup_folders(root: Path, proc_cgroup: Path) -> list[Path]:
    """Where this process's CPU controller files may be: its own cgroup (v2 unified, or v1's ``cpu``
    hierarchy) first, then the mount's top (a container sees its own cgroup there)."""
    paths: list[Path] = []
    for line in (_read(proc_cgroup) or "").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        relative = path.strip().lstrip("/")
        if controllers == "":
            paths.append(root / relative)
        elif "cpu" in controllers.split(","):
            paths += [root / mount / relative for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
    paths += [root, *(root / mount for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"))]
    return list(dict.fromkeys(paths))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        value, length = int(quota), int(period)
    except ValueError:
        return None
    return value / length if value > 0 and length > 0 else None


def cpu_budget(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> CpuBudget:
    """This process's CPU budget as the container sees it, and the load other processes put on it."""
    cores = os.cpu_count() or 1
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(cores))
    quota = cgroup_quota(root, proc_cgroup)
    return CpuBudget(affinity=len(cpus), quota=quota, cores=cores, busy=0.0 if quota else busy_cpus(cpus))


def busy_cpus(cpus: set[int], seconds: float = 0.25, stat: Path = Path("/proc/stat")) -> float:
    """How many of ``cpus`` other processes kept busy over ``seconds`` (``/proc/stat``; 0.0 where unreadable)."""
    before, own = _cpu_ticks(stat, cpus), time.process_time()
    time.sleep(seconds)
    after, own = _cpu_ticks(stat, cpus), time.process_time() - own
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    busy_share = (after[0] - before[0]) / (after[1] - before[1])  # of all the CPUs' time
    return max(0.0, busy_share * len(cpus) - own / seconds)


def _cpu_ticks(stat: Path, cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` so far: busy is everything but idle and iowait."""
    busy = total = 0
    for line in (_read(stat) or "").splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(value) for value in fields[:8]]
        busy, total = busy + sum(ticks) - ticks[3] - ticks[4], total + sum(ticks)
    return (busy, total) if total else None


def task_slots(environ: Mapping[str, str] = os.environ) -> int:
    """The copies of this work that share its CPUs (``AGPO_TASK_SLOTS``, default 1)."""
    value = environ.get(TASK_SLOTS_ENV, "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{TASK_SLOTS_ENV}={value!r} must be a whole number >= 1 (or unset)")
    return int(value)


def choose_threads(
    explicit: int | None, budget: CpuBudget | None = None, environ: Mapping[str, str] = os.environ
) -> ThreadChoice:
    """The thread count by the rule of this module's docstring: ``explicit`` (a config key), else
    ``OMP_NUM_THREADS``, else the usable CPUs divided by the task slots; never more than the cores."""
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if "LOCAL_RANK" in environ and omp.isdigit():  # a torchrun rank: its launcher's share (pipelines.launch)
        explicit = None
    check_threads(explicit)
    if explicit is not None:
        asked, source = explicit, "config key threads"
    elif omp.isdigit() and int(omp) >= 1:
        asked, source = int(omp), "OMP_NUM_THREADS"
    else:
        budget, slots = budget or cpu_budget(), task_slots(environ)
        return ThreadChoice(max(1, budget.usable // slots), f"{budget.describe()}; {slots} task slot(s)")
    cores = budget.cores if budget else os.cpu_count() or 1
    if asked > cores:
        return ThreadChoice(cores, f"{source}={asked}, capped at the machine's {cores} cores")
    return ThreadChoice(asked, source)


def airflow_task_slots(context: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> int:
    """How many instances of an Airflow task may run at once on its worker: its mapped count (1 unmapped)
    capped by the task's ``max_active_tis_per_dag`` / ``max_active_tis_per_dagrun`` and the executor's
    ``parallelism`` and ``max_active_tasks_per_dag`` (``AIRFLOW__CORE__*`` when set)."""
    task = getattr(context.get("ti"), "task", None)
    caps = [
        context.get("expanded_ti_count") or 1,
        getattr(task, "max_active_tis_per_dag", None),
        getattr(task, "max_active_tis_per_dagrun", None),
        *(environ.get(f"AIRFLOW__CORE__{key}") for key in ("PARALLELISM", "MAX_ACTIVE_TASKS_PER_DAG")),
    ]
    return max(1, min(int(cap) for cap in caps if cap is not None and str(cap).strip().isdigit() and int(cap) > 0))


def prepare_airflow_task(context: Mapping[str, Any], environ: dict[str, str] | None = None) -> None:
    """Before an Airflow task imports torch: ``AGPO_TASK_SLOTS`` from the task's context unless the deployment set
    it (``airflow dags test`` runs mapped tasks one at a time: ``make demo`` sets 1), then the wait policy that
    follows from it (``prepare_openmp``)."""
    target = os.environ if environ is None else environ
    target.setdefault(TASK_SLOTS_ENV, str(airflow_task_slots(context, target)))
    prepare_openmp(target)


def prepare_openmp(environ: dict[str, str] | None = None, budget: CpuBudget | None = None) -> None:
    """Put OpenMP's passive wait policy in the environment when this process shares its CPUs (more than one task
    slot, or CPUs busy with other processes) and the environment sets no policy; call it before torch is imported
    (libgomp reads it once, when it loads)."""
    target = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in target or target.get("OMP_NUM_THREADS", "").strip() == "1":  # one thread never waits
        return
    if task_slots(target) > 1 or (budget or cpu_budget()).taken > 0:
        target["OMP_WAIT_POLICY"] = WAIT_POLICY


def use_threads(explicit: int | None) -> ThreadChoice:
    """Choose this stage's thread count and give it to torch; returns the choice for the stage's summary. Inside
    ``step_threads`` for the same key, the step's choice (the one its MLflow params name) is used, not a new one."""
    import torch  # a stage that calls this runs torch anyway; the module stays importable without it

    step = _STEP_CHOICE.get()
    choice = step[1] if step is not None and step[0] == explicit else choose_threads(explicit)
    torch.set_num_threads(choice.threads)
    return choice


_STEP_CHOICE: ContextVar[tuple[int | None, ThreadChoice] | None] = ContextVar("step_threads", default=None)


@contextmanager
def step_threads(params: object) -> Iterator[dict[str, object]]:
    """For a step whose config has a ``threads`` key: choose its thread count once (the usable CPUs are sampled
    once), yield the MLflow params naming it (``threads_used``, ``threads_source``), and let the stage's
    ``use_threads`` take that same choice. Other steps yield no params."""
    if not hasattr(params, "threads"):
        yield {}
        return
    choice = choose_threads(params.threads)
    token = _STEP_CHOICE.set((params.threads, choice))
    try:
        yield {"threads_used": choice.threads, "threads_source": choice.source}
    finally:
        _STEP_CHOICE.reset(token)


def threads_field() -> Any:
    """The ``threads`` key of a stage that runs torch or onnxruntime (one help text for every stage)."""
    return field(
        default=None,
        metadata={
            "help": "CPU threads for torch and onnxruntime; null: OMP_NUM_THREADS when set, else the CPUs this "
            "process may use (affinity, cgroup quota) / AGPO_TASK_SLOTS (pipelines/threads.py); the stage's "
            "summary and MLflow params (threads_used, threads_source) say what it chose"
        },
    )


def pipeline_threads_field() -> Any:
    """The ``threads`` key of a pipeline: the default of its stages' own."""
    return field(default=None, metadata={"help": "threads of every stage that leaves its own threads null"})


def pass_threads_down(pipeline: Any, stages: tuple[str, ...]) -> None:
    """In a pipeline config's ``__post_init__``: each of ``stages`` whose ``threads`` is null takes the
    pipeline's, so the stage's config (its --print-config, its params) shows what it runs with."""
    check_threads(pipeline.threads)
    for name in stages:
        stage = getattr(pipeline, name)
        if pipeline.threads is not None and stage.threads is None:
            object.__setattr__(pipeline, name, replace(stage, threads=pipeline.threads))  # frozen: set once, here


def check_threads(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"threads must be a whole number >= 1 or null, got {value!r}")
