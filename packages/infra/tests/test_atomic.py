"""Work-folder results are written whole or not at all, and made once."""

from __future__ import annotations

import json

import numpy as np
import pytest

from krea2.infra.atomic import cached_array, publish_dir, write_json, write_with


def test_a_failed_write_leaves_no_target_and_the_old_one_stands(tmp_path):
    target = tmp_path / "result.json"

    def half(tmp):
        tmp.write_text('{"half": ')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_with(target, half)
    assert not target.exists()
    write_json(target, {"done": 1})
    with pytest.raises(RuntimeError):
        write_with(target, half)
    assert json.loads(target.read_text()) == {"done": 1}


def test_cached_array_is_made_once_and_read_back(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return np.arange(6, dtype=np.uint8).reshape(2, 3)

    path = tmp_path / "images.npy"
    first = cached_array(path, make)
    again = cached_array(path, make)
    assert calls == [1] and np.array_equal(first, again) and again.dtype == np.uint8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images.npy"]


def test_a_published_folder_is_whole_and_kept(tmp_path):
    def fill(tmp):
        (tmp / "a.txt").write_text("a")

    folder = publish_dir(tmp_path / "shards", fill)
    assert [p.name for p in folder.iterdir()] == ["a.txt"]
    publish_dir(folder, lambda tmp: (tmp / "b.txt").write_text("b"))
    assert [p.name for p in folder.iterdir()] == ["a.txt"]  # published whole: not redone

    def broken(tmp):
        (tmp / "part").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        publish_dir(tmp_path / "other", broken)
    assert not (tmp_path / "other").exists()
    publish_dir(tmp_path / "other", fill)  # a leftover temporary folder does not block it
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["a.txt"]
