"""JSON lines read back after a kill: a torn last line comes back apart, damage elsewhere names its line."""

import json
import os
import stat

import pytest

from durable.fileio import current_umask, read_jsonl, share_like_open


def test_a_torn_last_line_comes_back_apart_from_the_records(tmp_path):
    path = tmp_path / "log.jsonl"
    whole = "".join(json.dumps({"step": s, "text": "价格"}) + "\n" for s in range(3))
    path.write_text(whole, encoding="utf-8")
    assert read_jsonl(path) == ([{"step": s, "text": "价格"} for s in range(3)], b"")
    # killed inside a multi-byte character of the next line: the fragment is not even UTF-8
    torn = json.dumps({"step": 3, "text": "价格"}, ensure_ascii=False).encode()[:-5]
    path.write_bytes(whole.encode() + torn)
    assert read_jsonl(path) == ([{"step": s, "text": "价格"} for s in range(3)], torn)
    # a fragment that happens to parse is still torn: its newline, the last byte written, is missing
    path.write_bytes(whole.encode() + b'{"step": 3}')
    assert read_jsonl(path)[1] == b'{"step": 3}'
    path.write_bytes(b"")
    assert read_jsonl(path) == ([], b"")


def test_a_damaged_line_before_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "rew\n{"step": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"log.jsonl, line 2, is not JSON .* repair or delete that line"):
        read_jsonl(path)
    path.write_bytes(b'{"step": 0}\n\xff\n{"step": 2}')  # not UTF-8
    with pytest.raises(ValueError, match="line 2, is not JSON"):
        read_jsonl(path)


def test_share_like_open_gives_files_the_mode_open_would_under_the_umask(tmp_path):
    """safetensors writes 0600; a reader of another user in the group must get what open() would give."""
    written = tmp_path / "model.safetensors"
    written.write_bytes(b"weights")
    written.chmod(0o600)
    old = os.umask(0o002)
    try:
        assert current_umask() == 0o002
        share_like_open(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == 0o664
