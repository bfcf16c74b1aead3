"""Shard leases: one holder at a time across real processes, a dead or expired holder taken over, a holder
whose lease was taken over fenced off (even after its generation number is reused, or when it wakes after
its successor's release), a heartbeat that renews and one that fails, and holders of other containers."""

import itertools
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipelines.lease import Lease, LeaseLost, decode_record, encode_record, this_boot, this_pid_namespace
from pipelines.logs import configure_logging

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pipelines.lease import Lease

    folder, log = Path(sys.argv[1]), Path(sys.argv[2])
    lease = Lease(folder, "shard-00000", seconds=30)
    assert lease.acquire(done=lambda: False, poll=0.01)
    with log.open("a") as handle:
        handle.write(f"in {time.monotonic()}\\n")
    time.sleep(0.2)
    lease.check()
    with log.open("a") as handle:
        handle.write(f"out {time.monotonic()}\\n")
    lease.release()
    """
)


def test_four_processes_racing_for_one_lease_hold_it_one_after_another(tmp_path):
    log = tmp_path / "holds.log"
    workers = [
        subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "leases"), str(log)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for worker in workers:
        assert worker.wait(timeout=120) == 0, worker.stderr.read()
    events = [line.split() for line in log.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["in", "out"] * 4  # never two holders at once
    [tombstone] = (tmp_path / "leases" / "shard-00000").iterdir()  # the last release left only its tombstone
    assert decode_record(tombstone.read_bytes())["released"] and tombstone.name == "gen-000008.json"


def test_a_waiting_worker_stops_waiting_when_the_work_is_done(tmp_path):
    holder = Lease(tmp_path, "shard-00001", seconds=30)
    assert holder.acquire(done=lambda: False)
    finished = threading.Event()
    threading.Timer(0.3, finished.set).start()
    started = time.monotonic()
    assert not Lease(tmp_path, "shard-00001", seconds=30).acquire(done=finished.is_set, poll=0.05)
    assert time.monotonic() - started >= 0.3
    holder.check()  # still the holder
    holder.release()


def hang(lease: Lease) -> None:
    """A hung worker: its heartbeat stops renewing (the process lives on)."""
    lease.stop_heartbeat()


def test_an_expired_lease_is_taken_over_and_its_old_holder_is_fenced(tmp_path):
    hung = Lease(tmp_path, "shard-00002", seconds=0.4, attempt=1)
    assert hung.acquire(done=lambda: False)
    hang(hung)
    retry = Lease(tmp_path, "shard-00002", seconds=0.4, attempt=2)
    started = time.monotonic()
    assert retry.acquire(done=lambda: False, poll=0.05)
    assert retry.number == hung.number + 1 and time.monotonic() - started >= 0.4  # it watched it unchanged
    with pytest.raises(LeaseLost, match=r"taken over \(now .* \(try 2\)\)"):
        hung.check()
    retry.release()


def test_the_token_not_the_generation_number_fences(tmp_path):
    holder = Lease(tmp_path, "shard-00002", seconds=30)
    assert holder.acquire(done=lambda: False)
    hang(holder)
    (tmp_path / "shard-00002" / "gen-000001.json").unlink()  # taken over, released and swept meanwhile
    reused = Lease(tmp_path, "shard-00002", seconds=30)
    assert reused.acquire(done=lambda: False) and reused.number == holder.number  # generation 1 again
    assert not holder.lost.is_set()  # nothing but the fence's token comparison can refuse it now
    with pytest.raises(LeaseLost, match="taken over"):
        holder.check()
    reused.release()


def test_a_holder_that_wakes_after_its_successor_released_cannot_revive_its_lease(tmp_path):
    """W1's heartbeat read the lease as its own, then W1 froze; W2 took over, finished and released; W1's
    renewal must not bring its generation back, and its fence must refuse it."""
    w1 = Lease(tmp_path, "shard-00007", seconds=0.4, attempt=1)
    assert w1.acquire(done=lambda: False)
    hang(w1)
    read_before_freezing = w1.newest()
    w2 = Lease(tmp_path, "shard-00007", seconds=0.4, attempt=2)
    assert w2.acquire(done=lambda: False, poll=0.05)
    w2.release()
    w1.reader = lambda: read_before_freezing
    w1.start_heartbeat()  # its next beat acts on what it read before it froze
    time.sleep(0.2)
    w1.stop_heartbeat()
    w1.reader = w1.newest
    assert sorted(p.name for p in (tmp_path / "shard-00007").iterdir()) == ["gen-000003.json"]  # the tombstone
    with pytest.raises(LeaseLost):
        w1.check()


def test_a_renewal_never_creates_a_deleted_generation(tmp_path):
    holder = Lease(tmp_path, "shard-00008", seconds=30)
    assert holder.acquire(done=lambda: False)
    (tmp_path / "shard-00008" / "gen-000001.json").unlink()  # a successor's release deleted it
    with pytest.raises(LeaseLost):
        holder.check()
    assert list((tmp_path / "shard-00008").iterdir()) == []
    holder.release()


def test_the_heartbeat_renews_a_working_holder_so_no_one_takes_it_over(tmp_path):
    holder = Lease(tmp_path, "shard-00009", seconds=0.4)
    assert holder.acquire(done=lambda: False)
    finished = threading.Event()
    threading.Timer(1.6, finished.set).start()  # four lease lengths of waiting
    assert not Lease(tmp_path, "shard-00009", seconds=0.4).acquire(done=finished.is_set, poll=0.02)
    assert decode_record((tmp_path / "shard-00009" / "gen-000001.json").read_bytes())["beat"] >= 8
    holder.check()  # still the holder
    holder.release()


def test_a_heartbeat_that_fails_is_logged_and_fences_its_holder(tmp_path, capfd):
    configure_logging("annotate_shard", "r1", 10)  # as an Airflow task does: the project's format on stderr
    holder = Lease(tmp_path, "shard-00010", seconds=0.4)
    assert holder.acquire(done=lambda: False)

    def unreadable():
        raise OSError(5, "Input/output error")

    holder.reader = unreadable
    holder.heartbeat.join(timeout=5)
    assert not holder.heartbeat.is_alive() and holder.lost.is_set()
    assert (
        "WARNING [annotate_shard run=r1 shard=10] pipelines.lease: shard-00010: lease lost, commits are "
        "fenced: its heartbeat failed: OSError(5, 'Input/output error')" in capfd.readouterr().err
    )
    holder.reader = holder.newest
    with pytest.raises(LeaseLost):
        holder.check()


def write_generation(folder, **record):
    folder.mkdir(exist_ok=True)
    fields = {"attempt": 1, "seconds": 3600, "beat": 0, "boot": this_boot(), "pidns": this_pid_namespace(), **record}
    (folder / "gen-000001.json").write_bytes(encode_record({"host": socket.gethostname(), **fields}))


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def acquire_within(lease: Lease, seconds: float) -> bool:
    """``acquire`` that gives up after ``seconds`` (a regression fails instead of hanging)."""
    deadline = time.monotonic() + seconds
    return lease.acquire(done=lambda: time.monotonic() > deadline, poll=0.05)


def test_a_lease_of_a_killed_process_on_this_host_is_taken_over_at_once(tmp_path):
    write_generation(tmp_path / "shard-00003", pid=dead_pid(), token="dead")
    lease = Lease(tmp_path, "shard-00003", seconds=3600)
    assert acquire_within(lease, 10) and lease.number == 2  # no waiting for the hour-long lease
    lease.release()


def test_a_lease_of_a_process_in_another_pid_namespace_is_not_judged_by_its_pid(tmp_path):
    """Another container on this host and boot: its pid means nothing here, so it is waited for."""
    write_generation(tmp_path / "shard-00011", pid=dead_pid(), token="container", pidns="pid:[1]")
    assert not acquire_within(Lease(tmp_path, "shard-00011", seconds=3600), 0.5)


def test_a_live_lease_of_another_host_is_waited_for_however_its_clock_reads(tmp_path):
    write_generation(tmp_path / "shard-00004", host="elsewhere", boot="", pid=1, token="other", seconds=60)
    assert not acquire_within(Lease(tmp_path, "shard-00004", seconds=60), 0.3)
    assert decode_record((tmp_path / "shard-00004" / "gen-000001.json").read_bytes())["token"] == "other"


def test_a_lease_that_stopped_changing_is_taken_over_after_its_length_on_the_waiters_clock(tmp_path):
    write_generation(tmp_path / "shard-00012", host="elsewhere", boot="", pid=1, token="gone", seconds=0.3)
    started = time.monotonic()
    lease = Lease(tmp_path, "shard-00012", seconds=0.3)
    assert acquire_within(lease, 10) and lease.number == 2
    assert time.monotonic() - started >= 0.3
    lease.release()


def test_the_lease_length_is_measured_on_the_injected_clock(tmp_path):
    """An hour-long lease that stopped changing is taken over once the waiter's clock has seen it unchanged for
    an hour: a clock that advances ten minutes a reading takes it over at once, the real one would wait."""
    write_generation(tmp_path / "shard-00014", host="elsewhere", boot="", pid=1, token="gone", seconds=3600)
    readings = itertools.count(step=600.0)
    lease = Lease(tmp_path, "shard-00014", seconds=3600, clock=lambda: next(readings))
    started = time.monotonic()
    assert lease.acquire(done=lambda: False, poll=0.001) and lease.number == 2
    assert time.monotonic() - started < 5 and next(readings) >= 3600
    lease.release()
    patient = Lease(tmp_path, "shard-00015", seconds=3600)
    write_generation(tmp_path / "shard-00015", host="elsewhere", boot="", pid=1, token="gone", seconds=3600)
    assert not patient.acquire(done=lambda: time.monotonic() - started > 6, poll=0.01)  # the real clock waits


def _temp_path_after_a_release(monkeypatch, releases: int) -> list:
    """Make the release land between a taker's ``mkdir`` and its temp file, ``releases`` times."""
    import pipelines.io

    real_temp_path, raced = pipelines.io.temp_path, []

    def temp_path_after_a_release(target):
        if len(raced) < releases:
            raced.append(target)
            target.parent.rmdir()  # what ``Lease.release`` does to a folder it just emptied
        return real_temp_path(target)

    monkeypatch.setattr(pipelines.io, "temp_path", temp_path_after_a_release)
    return raced


def test_a_release_removing_the_empty_folder_mid_take_makes_the_taker_make_it_again(tmp_path, monkeypatch):
    """The race the four-process test hit once in CI, made certain: a holder's release removes the empty
    lease folder after a taker's ``mkdir`` and before its temp file exists."""
    raced = _temp_path_after_a_release(monkeypatch, releases=2)
    lease = Lease(tmp_path, "shard-00005", seconds=30)
    assert lease.acquire(done=lambda: False, poll=0.01) and lease.number == 1
    assert len(raced) == 2  # raced twice, took generation 1 on the third try
    lease.release()


def test_a_folder_that_keeps_vanishing_is_an_error_not_a_loop(tmp_path, monkeypatch):
    _temp_path_after_a_release(monkeypatch, releases=3)
    with pytest.raises(FileNotFoundError, match=r"gen-000001\.json"):
        Lease(tmp_path, "shard-00006", seconds=30).acquire(done=lambda: False, poll=0.01)


def test_a_lease_whose_thread_died_without_releasing_it_is_freed_by_its_heartbeat(tmp_path):
    """A killed worker thread in a process that lives on: its pid says alive, so only the lease itself can
    tell; another worker of the same process takes it within a heartbeat or two, not after the lease."""

    def take_and_die():
        Lease(tmp_path, "shard-00013", seconds=2).acquire(done=lambda: False)  # the thread ends, no release

    thread = threading.Thread(target=take_and_die)
    thread.start()
    thread.join()
    successor = Lease(tmp_path, "shard-00013", seconds=2)
    started = time.monotonic()
    assert acquire_within(successor, 10) and successor.number == 3  # above the dead thread's tombstone
    assert time.monotonic() - started < 1.5  # not the 2 s a lease that stopped changing takes
    successor.release()


def test_a_take_interrupted_after_its_link_leaves_no_generation_behind(tmp_path, monkeypatch):
    import pipelines.lease as lease_module

    def link_then_interrupt(*args, **kwargs):
        real_write_atomic(*args, **kwargs)
        raise KeyboardInterrupt  # the generation exists, then the worker is interrupted

    real_write_atomic = lease_module.write_atomic
    monkeypatch.setattr(lease_module, "write_atomic", link_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        Lease(tmp_path, "shard-00014", seconds=3600).acquire(done=lambda: False)
    assert list((tmp_path / "shard-00014").iterdir()) == []  # so a retry in this live process takes it at once


def test_clearing_a_runs_leases_keeps_one_a_second_merger_holds(tmp_path):
    """The first merger releases the merge lease, a second takes it, then the first clears the run's leases:
    the second's live lease stays (it used to be deleted, fencing the second merger off its own merge), and
    the folder goes once that lease is released too."""
    from pipelines.lease import remove_leases

    folder = tmp_path / "leases"
    first, shard = Lease(folder, "merge", seconds=30), Lease(folder, "shard-00000", seconds=30)
    assert first.acquire(done=lambda: False, poll=0.01) and shard.acquire(done=lambda: False, poll=0.01)
    shard.release()
    first.release()
    second = Lease(folder, "merge", seconds=30)
    assert second.acquire(done=lambda: False, poll=0.01)
    remove_leases(folder)
    assert not (folder / "shard-00000").exists()  # released: cleared
    second.check()  # still its lease
    second.release()
    remove_leases(folder)
    assert not folder.exists()
