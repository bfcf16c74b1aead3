"""Input paths that are not regular files (/dev/zero, a FIFO, a folder, a symlink loop) are refused with a
message naming the path and what it is, exit 1 (2 for a config file), before anything opens or hashes
them: each stage runs under an alarm, so one that blocks on a FIFO or reads /dev/zero fails instead of
hanging."""

import os
import re
import signal
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.errors import StageFailed
from pipelines.io import require_file

SECONDS = 90  # far above a refusal (the stage's imports included), far below a hang


class Hung(BaseException):
    """Not an Exception: no stage's error handling may turn the alarm into an expected failure."""


@pytest.fixture
def deadline():
    def expire(signum, frame):
        raise Hung(f"still running after {SECONDS} s: the stage opened or read a path that is not a regular file")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def not_a_file(kind: str, folder: Path) -> Path:
    """A path of ``kind`` named like an input file (its extension gives the format)."""
    if kind == "/dev/zero":
        return Path("/dev/zero")
    path = folder / "pairs.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:  # a symlink loop
        os.symlink(folder / "other.jsonl", path)
        os.symlink(path, folder / "other.jsonl")
    return path


KINDS = {
    "/dev/zero": "is a character device, not a regular file",
    "fifo": r"is a named pipe \(FIFO\), not a regular file",
    "folder": "is a folder, not a regular file",
    "symlink loop": "is a symlink loop",
}


@pytest.mark.parametrize("kind", KINDS)
def test_require_file_names_what_the_path_is_and_the_fix(kind, tmp_path):
    path = not_a_file(kind, tmp_path)
    with pytest.raises(StageFailed, match=rf"^input {re.escape(str(path))} {KINDS[kind]}.*; fix it$"):
        require_file(path, "input", "fix it")


def test_require_file_follows_symlinks_and_names_a_missing_target(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(real)
    assert require_file(tmp_path / "link.jsonl", "input", "fix it") == tmp_path / "link.jsonl"
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(ValueError, match=r"is a symlink to .*gone\.jsonl, which does not exist; fix it"):
        require_file(tmp_path / "dangling.jsonl", "input", "fix it", ValueError)
    with pytest.raises(StageFailed, match=r"none\.jsonl does not exist; fix it"):
        require_file(tmp_path / "real.jsonl" / "none.jsonl", "input", "fix it")  # a file as a folder


@pytest.mark.parametrize("stage", ["score", "data import"])
@pytest.mark.parametrize("kind", KINDS)
def test_score_and_data_import_refuse_an_input_that_is_not_a_regular_file(stage, kind, tmp_path, capsys, deadline):
    path = not_a_file(kind, tmp_path)
    args = ["--set", f"input.path={path}", "--set", "input.format=jsonl", "--set", f"out_dir={tmp_path / 'out'}"]
    assert main([*stage.split(), *args]) == 1
    err = capsys.readouterr().err
    if kind == "folder":  # a folder is a dataset (pipelines.storage.parts): this one holds no part file
        assert f"agpo {stage.replace(' ', '-')}: error: {path} holds no data file (0 in all)" in err, err
        return
    assert f"agpo {stage.replace(' ', '-')}: error: input file {path} " in err and "fix input.path" in err, err
    assert re.search(KINDS[kind], err) and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["train", "--set", "pairs={path}"], 1, "pairs file {path} is a named pipe"),
        (["teacher", "--set", "pairs={path}"], 1, "pairs file {path} is a named pipe"),
        (["review", "import", "--set", "export={path}"], 1, "Label Studio export {path} is a named pipe"),
        (["score", "--config", "{path}"], 2, "config error: config file {path} is a named pipe"),
    ],
    ids=["train", "teacher", "review import", "config"],
)
def test_other_stages_refuse_a_fifo_where_they_read_a_user_path(argv, code, message, tmp_path, capsys, deadline):
    path = not_a_file("fifo", tmp_path)
    assert main([a.format(path=path) for a in argv]) == code
    err = capsys.readouterr().err
    assert message.format(path=path) in err and "Traceback" not in err, err
