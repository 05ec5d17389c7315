"""Reference accumulation loops, one file each; see each module's docstring for its identity."""

from .amp import amp
from .large_batch import large_batch
from .naive import naive
from .normalized import normalized
from .ragged import ragged

LOOPS = {"naive": naive, "normalized": normalized, "ragged": ragged, "amp": amp, "large_batch": large_batch}

__all__ = ["LOOPS", "amp", "large_batch", "naive", "normalized", "ragged"]
