"""ivhl_jax.run.io.load_array: a NumPy file given by a user is read, or refused in one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from ivhl_jax.run.io import load_array


def test_npy_and_single_array_npz_are_read(tmp_path):
    a = np.arange(16.0).reshape(2, 2, 2, 2)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "a.npz", term=a)
    np.testing.assert_array_equal(load_array(tmp_path / "a.npy", "term_file"), a)
    np.testing.assert_array_equal(load_array(str(tmp_path / "a.npz"), "term_file"), a)


def _refused(path, *words):
    with pytest.raises(ValueError) as info:
        load_array(path, "term_file")
    msg = str(info.value)
    assert msg.startswith("term_file: ") and "\n" not in msg, msg
    assert "allow_pickle" not in msg and ".npy" in msg, msg
    for w in words:
        assert w in msg, msg


def test_other_files_are_one_line_naming_the_key_and_the_formats(tmp_path):
    text = tmp_path / "h.npy"
    text.write_text("1 0 0 1\n0 1 1 0\n")  # a text file under a .npy name: NumPy would advise allow_pickle
    _refused(text, "not a readable .npy file")
    _refused(tmp_path / "missing.npy", "no such file")
    txt = tmp_path / "h.txt"
    txt.write_text("1 2 3")
    _refused(txt, "not a NumPy array file")
    good = tmp_path / "g.npy"
    np.save(good, np.ones((2, 2, 2, 2)))
    data = good.read_bytes()
    cut = tmp_path / "cut.npy"
    cut.write_bytes(data[: len(data) // 2])
    _refused(cut, "not a readable .npy file")
    pickled = tmp_path / "p.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    _refused(pickled, "pickled")
    two = tmp_path / "two.npz"
    np.savez(two, a=np.ones(2), b=np.ones(2))
    _refused(two, "holds 2 arrays")
    zipped = tmp_path / "bad.npz"
    zipped.write_bytes(b"PK\x03\x04 not really a zip")
    _refused(zipped, "not a readable .npz file")
