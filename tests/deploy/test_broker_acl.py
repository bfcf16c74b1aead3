"""The broker's per-role access on a real Redis (deploy/datastores.py, started as ``up`` starts it): a task's broker
user can neither publish to nor read the ``register`` queue, nor flush the broker; the register worker's reaches
the register queue only; the scheduler's publishes to every queue; nobody gets in without a user. As root,
Redis runs as Debian's ``redis`` user. (That Celery works under these rules is shown by the stack's DAG runs,
tests/deploy/test_distributed_stack.py.)"""

import shutil
import tempfile
from pathlib import Path

import pytest
import redis

from deploy import services
from deploy.credentials import Credentials
from deploy.datastores import broker_password, redis_user, start_redis
from deploy.services import free_port
from deploy.stack_config import StackConfig

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
PRIORITY = "\x06\x163"  # kombu's priority list of a queue: <queue> + separator + priority


@pytest.fixture(scope="module")
def broker():
    home = Path(tempfile.mkdtemp(prefix="agpo-redis-"))
    home.chmod(0o755)  # Redis runs as user redis when the tests run as root: it must reach its folder
    config = StackConfig(home=home, redis_port=free_port())
    credentials = Credentials.load(home)
    start_redis(config, credentials)
    try:
        yield config, credentials
    finally:
        services.stop(config.run_dir, "redis")
        shutil.rmtree(home, ignore_errors=True)


def client(broker, role: str) -> redis.Redis:
    config, credentials = broker
    return redis.Redis(port=config.redis_port, username=role, password=broker_password(credentials, role))


def test_a_task_can_neither_publish_to_the_register_queue_nor_read_it_nor_flush_the_broker(broker):
    tasks = client(broker, "tasks")
    for command in (
        lambda: tasks.lpush("register", "forged"),
        lambda: tasks.lpush(f"register{PRIORITY}", "forged"),
        lambda: tasks.brpop(["register"], timeout=1),
        lambda: tasks.lrange("register", 0, -1),
        lambda: tasks.hgetall("unacked-registrar"),
        lambda: tasks.sadd("_kombu.binding.register", "register\x06\x16\x06\x16default"),
        tasks.flushall,
        tasks.flushdb,
        lambda: tasks.keys("*"),
        lambda: tasks.config_set("requirepass", ""),
        lambda: tasks.publish("/0.other-channel", "x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            command()
    # what a worker does with its own queues works: take a message, keep it unacked, bind its queue
    scheduler = client(broker, "scheduler")
    scheduler.lpush("default", "task")
    assert tasks.brpop(["default", "accelerator", f"default{PRIORITY}"], timeout=1) == (b"default", b"task")
    tasks.hset("unacked-tasks", "tag", "message")
    tasks.sadd("_kombu.binding.default", "default\x06\x16\x06\x16default")
    tasks.publish("/0.celeryev/worker.heartbeat", "{}")


def test_the_register_worker_reaches_the_register_queue_only_and_the_scheduler_every_queue(broker):
    scheduler, registrar = client(broker, "scheduler"), client(broker, "registrar")
    scheduler.lpush("register", "register task")
    assert registrar.brpop(["register"], timeout=1) == (b"register", b"register task")
    for command in (lambda: registrar.lpush("default", "x"), lambda: registrar.hgetall("unacked-tasks")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            command()
    with pytest.raises(redis.exceptions.NoPermissionError):
        scheduler.flushall()
    anonymous = redis.Redis(port=broker[0].redis_port)
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ResponseError)):
        anonymous.lpush("register", "forged")
    wrong = redis.Redis(port=broker[0].redis_port, username="tasks", password=broker[1].redis)
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()  # the scheduler's password is not the workers'


def test_redis_runs_as_its_own_user_when_up_runs_as_root(broker):
    config, _ = broker
    pid = services.recorded_pid(config.run_dir, "redis")
    uid = next(
        line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
    )
    expected = redis_user()
    assert (int(uid) == 0) == (expected is None)
    conf = (config.home / "redis" / "redis.conf").read_text()
    assert broker[1].redis_tasks not in conf and "requirepass" not in conf  # password hashes only
