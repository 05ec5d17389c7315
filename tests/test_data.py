"""The digits accumlib trains on are scikit-learn's, from the copy of its file that ships in accumlib."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from accumlib import data

SKLEARN_LOADED = (
    "import sys, accumlib.data as d; d.digits(); "
    "print(sorted({'sklearn', 'scipy', 'pandas'} & set(sys.modules)))"
)


def test_digits_are_scikit_learns_load_digits():
    from sklearn.datasets import load_digits

    x, y = data._digits_arrays()
    bunch = load_digits()
    assert (x.dtype, y.dtype) == (torch.float64, torch.int64)
    assert str(bunch.data.dtype) == "float64" and str(bunch.target.dtype) == "int64"
    assert np.array_equal(x.numpy(), bunch.data) and np.array_equal(y.numpy(), bunch.target)


def test_digits_hands_out_copies():
    """The parsed file is cached for the process: a caller that edits its dataset edits only its own."""
    first = data.digits(5)
    first.tensors[0].zero_(), first.tensors[1].fill_(-1)
    again = data.digits(5)
    assert again.tensors[0].abs().sum() > 0 and (again.tensors[1] >= 0).all()


def test_loading_digits_imports_no_scikit_learn():
    """scikit-learn with scipy and pandas adds ~140 MiB to every lesson kernel that loads the digits
    (benchmarks/kernel_memory.py measured it); accumlib reads its own copy of the file."""
    out = subprocess.run(
        [sys.executable, "-c", SKLEARN_LOADED], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
