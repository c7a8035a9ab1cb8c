"""The 8x8 handwritten digits (1797 images, 10 classes), shipped with the package: no download, no scikit-learn.

The data are scikit-learn's ``sklearn.datasets.load_digits`` (the test set of the UCI "Optical Recognition of
Handwritten Digits" data, Alpaydin & Kaynak 1998, CC BY 4.0): each image is 8x8 counts in 0..16 of the pixels set
in a 4x4 block of a 32x32 bitmap. They are stored in ``ivhl_jax/train/_digits_data.py`` as the 1797 x 64 counts
then the 1797 labels, one byte each, LZMA-compressed and Base85-encoded (49 KB), with the SHA-256 of the bytes.
That module is written by ``python -m ivhl_jax.train.digits`` from scikit-learn's copy (the only use of
scikit-learn); ``tests/train/test_data.py`` checks that :func:`load_digits` equals it bit for bit where
scikit-learn is installed.
"""

from __future__ import annotations

import base64
import hashlib
import lzma
import os
import sys

import numpy as np

__all__ = ["N_SAMPLES", "N_FEATURES", "load_digits", "write_data_module"]

N_SAMPLES = 1797
N_FEATURES = 64


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: ``x`` float64 (1797, 64), pixel counts 0..16 row by row; ``y`` int64 (1797,), the digit 0..9.

    The same arrays, in the same order and dtypes, as ``sklearn.datasets.load_digits(return_X_y=True)``.
    """
    from ivhl_jax.train import _digits_data as digits_data  # this module's data, written by it

    raw = lzma.decompress(base64.b85decode(digits_data.PACKED))
    if len(raw) != N_SAMPLES * (N_FEATURES + 1) or hashlib.sha256(raw).hexdigest() != digits_data.SHA256:
        raise RuntimeError(
            "the bundled digits data (ivhl_jax/train/_digits_data.py) is damaged: reinstall ivhl_jax "
            "or rewrite it with `python -m ivhl_jax.train.digits`"
        )
    counts = np.frombuffer(raw, np.uint8)
    x = counts[: N_SAMPLES * N_FEATURES].reshape(N_SAMPLES, N_FEATURES).astype(np.float64)
    y = counts[N_SAMPLES * N_FEATURES :].astype(np.int64)
    return x, y


def write_data_module(path: str | os.PathLike) -> str:
    """Write ``ivhl_jax/train/_digits_data.py`` to ``path`` from scikit-learn's ``load_digits``; returns the path."""
    from sklearn.datasets import load_digits as sklearn_digits

    x, y = sklearn_digits(return_X_y=True)
    if x.shape != (N_SAMPLES, N_FEATURES) or not (np.array_equal(x, np.round(x)) and x.min() >= 0 and x.max() <= 16):
        raise ValueError(f"scikit-learn's digits are not 1797 x 64 counts in 0..16 (shape {x.shape})")
    raw = np.concatenate([x.astype(np.uint8).ravel(), y.astype(np.uint8)]).tobytes()
    text = base64.b85encode(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)).decode("ascii")
    width = 116
    lines = [f'    b"{text[i : i + width]}"' for i in range(0, len(text), width)]
    with open(path, "w", encoding="ascii") as f:
        f.write(
            '"""The bundled 8x8 digits (see ivhl_jax.train.digits). Written by `python -m ivhl_jax.train.digits`; '
            'do not edit."""\n\n'
        )
        f.write('__all__ = ["SHA256", "PACKED"]\n\n')
        f.write(f'SHA256 = "{hashlib.sha256(raw).hexdigest()}"\n\n')
        f.write("PACKED = (\n" + "\n".join(lines) + "\n)\n")
    return os.fspath(path)


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "_digits_data.py")
    print(f"wrote {write_data_module(target)}")
