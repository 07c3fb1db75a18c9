"""hat_jax.cache: the digest's canonical JSON, atomic file and folder writes, the lock."""

import hashlib
import os

import pytest

from hat_jax.cache import atomic_dir, digest, exclusive_lock, temp_sibling_dir, write_json_atomic, write_text_atomic


def test_digest_is_the_sha256_of_compact_sorted_json():
    expected = hashlib.sha256(b'{"a":[1,2],"b":"x"}').hexdigest()
    assert digest({"b": "x", "a": [1, 2]}, 64) == expected
    assert digest({"a": [1, 2], "b": "x"}) == expected[:10]


def test_write_text_atomic_replaces_and_leaves_no_partial(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    write_text_atomic(path, "one")
    write_text_atomic(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.txt"]
    assert os.stat(path).st_mode & 0o777 == 0o644
    write_json_atomic(tmp_path / "j.json", {"b": 1, "a": 2})
    assert (tmp_path / "j.json").read_text() == '{\n "a": 2,\n "b": 1\n}\n'


def test_atomic_dir_renames_on_success_and_cleans_on_error(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "x").write_text("1")
        assert not target.exists()
    assert (target / "x").read_text() == "1" and os.stat(target).st_mode & 0o777 == 0o755
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "bad") as tmp:
        (tmp / "x").write_text("1")
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_keeps_a_target_another_writer_finished(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "mine").write_text("1")
        target.mkdir()
        (target / "theirs").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_temp_sibling_dir_clears_stale_partials(tmp_path):
    (tmp_path / ".out.partial-old").mkdir()
    with temp_sibling_dir(tmp_path / "out", clear_stale=True) as tmp:
        assert [p.name for p in tmp_path.iterdir()] == [tmp.name]
    assert list(tmp_path.iterdir()) == []


def test_exclusive_lock_is_reentrant_across_blocks(tmp_path):
    lock = tmp_path / "x.lock"
    with exclusive_lock(lock):
        pass
    with exclusive_lock(lock):
        assert lock.exists()
