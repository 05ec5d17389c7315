import os

import pytest
import torch

# Two cores in CI: one intra-op thread per test process keeps timings and rounding stable.
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
