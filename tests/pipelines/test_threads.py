"""The thread rule of pipelines.threads: config key, OMP_NUM_THREADS, affinity, cgroup quota (v1 and v2) and
task slots, on cgroup trees written in tmp_path; no timing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines.threads import (
    CpuBudget,
    airflow_task_slots,
    cgroup_quota,
    choose_threads,
    prepare_airflow_task,
    prepare_openmp,
    task_slots,
)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_is_read_from_the_processs_own_cgroup(tmp_path):
    write(tmp_path / "proc-cgroup", "0::/jobs/worker-1\n")
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")  # the root: no limit
    write(tmp_path / "cg" / "jobs" / "worker-1" / "cpu.max", "150000 100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc-cgroup") == 1.5


def test_a_container_sees_its_v2_quota_at_the_mounts_top(tmp_path):
    write(tmp_path / "proc-cgroup", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "200000 100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc-cgroup") == 2.0


def test_max_means_no_quota(tmp_path):
    write(tmp_path / "proc-cgroup", "0::/\n")
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc-cgroup") is None


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
def test_a_cgroup_v1_quota_is_quota_over_period(tmp_path, mount):
    write(tmp_path / "proc-cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    write(tmp_path / "cg" / mount / "docker" / "abc" / "cpu.cfs_quota_us", "300000\n")
    write(tmp_path / "cg" / mount / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc-cgroup") == 3.0


def test_a_v1_quota_of_minus_one_and_a_missing_tree_mean_no_quota(tmp_path):
    write(tmp_path / "proc-cgroup", "1:cpu:/\n")
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(tmp_path / "cg", tmp_path / "proc-cgroup") is None
    assert cgroup_quota(tmp_path / "none", tmp_path / "no-proc-file") is None


def test_usable_cpus_are_the_fewest_of_affinity_quota_and_cores():
    assert CpuBudget(affinity=8, quota=2.5, cores=64).usable == 2  # a --cpus 2.5 container on a big host
    assert CpuBudget(affinity=3, quota=None, cores=64).usable == 3  # taskset / cpuset
    assert CpuBudget(affinity=4, quota=0.5, cores=4).usable == 1  # a fraction of a CPU still runs one thread
    assert CpuBudget(affinity=4, quota=None, cores=4).usable == 4


def test_without_a_key_the_usable_cpus_are_divided_by_the_task_slots():
    budget = CpuBudget(affinity=8, quota=None, cores=8)
    assert choose_threads(None, budget, {}).threads == 8
    assert choose_threads(None, budget, {"AGPO_TASK_SLOTS": "4"}).threads == 2
    assert choose_threads(None, budget, {"AGPO_TASK_SLOTS": "3"}).threads == 2  # rounded down
    assert choose_threads(None, budget, {"AGPO_TASK_SLOTS": "16"}).threads == 1  # never 0
    quota = choose_threads(None, CpuBudget(affinity=64, quota=2.0, cores=64), {"AGPO_TASK_SLOTS": "2"})
    assert quota.threads == 1 and "cgroup quota 2" in quota.source and "2 task slot" in quota.source


def test_the_config_key_wins_then_omp_num_threads_and_neither_exceeds_the_cores():
    budget = CpuBudget(affinity=2, quota=None, cores=4)
    env = {"OMP_NUM_THREADS": "3", "AGPO_TASK_SLOTS": "2"}
    assert choose_threads(2, budget, env).params() == {"threads": 2, "threads_source": "config key threads"}
    assert choose_threads(None, budget, env).params() == {"threads": 3, "threads_source": "OMP_NUM_THREADS"}
    capped = choose_threads(16, budget, env)
    assert capped.threads == 4 and "capped" in capped.source
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        choose_threads(0, budget, env)


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_slot_count_names_the_variable(value):
    with pytest.raises(ValueError, match="AGPO_TASK_SLOTS"):
        task_slots({"AGPO_TASK_SLOTS": value})


def test_the_passive_wait_policy_is_set_when_the_cpus_are_shared_and_the_environment_sets_none():
    quiet, busy = CpuBudget(affinity=2, quota=None, cores=2), CpuBudget(affinity=2, quota=None, cores=2, busy=1.0)
    env = {}
    prepare_openmp(env, quiet)
    assert env == {}  # the whole machine: libgomp's default (a short spin, then sleep)
    prepare_openmp(env, busy)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"AGPO_TASK_SLOTS": "2"}
    prepare_openmp(env, quiet)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    env = {"OMP_WAIT_POLICY": "ACTIVE", "AGPO_TASK_SLOTS": "4"}
    prepare_openmp(env, busy)
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"


def test_use_threads_sets_torchs_intra_op_threads_in_a_fresh_process():
    code = (
        "import torch; from pipelines.threads import use_threads; "
        "choice = use_threads(None); print(choice.threads, torch.get_num_threads())"
    )
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env["AGPO_TASK_SLOTS"] = str(len(os.sched_getaffinity(0)) * 2)  # more slots than CPUs: one thread
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


class Task:  # the attributes of an Airflow operator that the slot count reads
    def __init__(self, per_dag=None, per_dagrun=None):
        self.max_active_tis_per_dag, self.max_active_tis_per_dagrun = per_dag, per_dagrun


class TaskInstance:
    def __init__(self, task):
        self.task = task


def test_a_mapped_task_counts_the_instances_that_may_run_at_once():
    mapped = {"ti": TaskInstance(Task(per_dag=4)), "expanded_ti_count": 8}
    assert airflow_task_slots(mapped, {}) == 4
    assert airflow_task_slots(mapped, {"AIRFLOW__CORE__PARALLELISM": "3"}) == 3
    assert airflow_task_slots({**mapped, "expanded_ti_count": 2}, {}) == 2
    assert airflow_task_slots({"ti": TaskInstance(Task()), "expanded_ti_count": 6}, {}) == 6
    assert airflow_task_slots({"ti": TaskInstance(Task(per_dagrun=2)), "expanded_ti_count": 6}, {}) == 2
    assert airflow_task_slots({"ti": TaskInstance(Task(per_dag=2))}, {}) == 1  # not mapped


def test_an_airflow_task_gets_the_passive_policy_and_its_slots_unless_the_deployment_set_them():
    context = {"ti": TaskInstance(Task(per_dag=4)), "expanded_ti_count": 4}
    env = {}
    prepare_airflow_task(context, env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "AGPO_TASK_SLOTS": "4"}
    env = {"AGPO_TASK_SLOTS": "1"}  # make demo: airflow dags test runs mapped tasks one at a time
    prepare_airflow_task(context, env)
    assert env["AGPO_TASK_SLOTS"] == "1"


def test_a_torchrun_rank_runs_with_its_launchers_share_not_the_config_key():
    budget = CpuBudget(affinity=4, quota=None, cores=4)
    rank = {"LOCAL_RANK": "1", "OMP_NUM_THREADS": "2"}  # pipelines.launch: 4 threads over 2 ranks
    assert choose_threads(4, budget, rank).params() == {"threads": 2, "threads_source": "OMP_NUM_THREADS"}


def test_a_pipelines_threads_are_the_default_of_its_stages_own():
    from pipelines.ads.pipeline_config import AdsPipelineConfig
    from pipelines.config import load_config
    from pipelines.math.math_pipeline_config import MathPipelineConfig

    ads = load_config(AdsPipelineConfig, overrides=["threads=1", "distil.threads=2"])
    assert [ads.teacher.threads, ads.train.threads, ads.annotate.threads, ads.evaluate.threads] == [1, 1, 1, 1]
    assert ads.distil.threads == 2  # a stage's own key wins
    assert load_config(AdsPipelineConfig).annotate.threads is None
    math = load_config(MathPipelineConfig, overrides=["threads=3"])
    assert (math.train.threads, math.evaluate.threads) == (3, 3)
    with pytest.raises(ValueError, match="threads must be a whole number >= 1 or null, got 0"):
        load_config(AdsPipelineConfig, overrides=["annotate.threads=0"])


def test_cpus_other_processes_keep_busy_are_left_to_them_unless_a_quota_is_what_this_process_gets():
    assert CpuBudget(affinity=2, quota=None, cores=2, busy=1.0).usable == 1
    assert CpuBudget(affinity=8, quota=None, cores=8, busy=2.7).usable == 6  # 2.95 -> 2 taken
    assert CpuBudget(affinity=8, quota=None, cores=8, busy=2.8).usable == 5  # 3.05 -> 3 taken
    assert CpuBudget(affinity=2, quota=None, cores=2, busy=5.0).usable == 1  # never 0
    assert CpuBudget(affinity=64, quota=4.0, cores=64, busy=50.0).usable == 4  # the host's load is not counted
    assert "1 busy with other processes" in CpuBudget(affinity=2, quota=None, cores=2, busy=0.9).describe()


def test_busy_cpus_reads_only_this_processs_cpus_from_proc_stat(tmp_path):
    from pipelines.threads import _cpu_ticks

    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  10 0 10 80 0 0 0 0 0 0\n"
        "cpu0 5 0 5 40 0 0 0 0 0 0\n"  # user nice system idle iowait irq softirq steal
        "cpu1 5 0 5 30 10 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    assert _cpu_ticks(stat, {0, 1}) == (20, 100) and _cpu_ticks(stat, {1}) == (10, 50)
    assert _cpu_ticks(tmp_path / "missing", {0}) is None


def test_a_busy_process_on_this_machine_is_seen():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        from pipelines.threads import busy_cpus

        assert busy_cpus(os.sched_getaffinity(0), seconds=1.0) >= 0.75
    finally:
        busy.kill()
        busy.wait()
