"""The digits accumlib trains on are scikit-learn's, read from its bundled file without importing it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from accumlib import data

SKLEARN_LOADED = (
    "import sys, accumlib.data as d; d.digits(); "
    "print(sorted({'sklearn', 'scipy', 'pandas'} & set(sys.modules)))"
)


def test_digits_are_scikit_learns_load_digits():
    from sklearn.datasets import load_digits

    x, y = data._digits_arrays()
    bunch = load_digits()
    assert x.dtype == bunch.data.dtype and y.dtype == bunch.target.dtype
    assert np.array_equal(x, bunch.data) and np.array_equal(y, bunch.target)
    assert not x.flags.writeable and not y.flags.writeable  # shared by every caller: nobody may edit it


def test_loading_digits_imports_no_scikit_learn():
    """scikit-learn with scipy and pandas adds ~140 MiB to every lesson kernel that loads the digits
    (benchmarks/kernel_memory.py measured it); only its data file is read."""
    out = subprocess.run(
        [sys.executable, "-c", SKLEARN_LOADED], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
