"""Reference accumulation loops, one file each; see each module's docstring for its identity.

``LOOPS`` holds the five that ``accumlib verify`` tabulates. ``grad_divided`` is the seed
documents' equivalent of ``normalized`` (divide ``.grad`` after the window instead of the
loss), kept beside it so the lesson can run both.
"""

from .amp import amp
from .grad_divided import grad_divided
from .large_batch import large_batch
from .naive import naive
from .normalized import normalized
from .ragged import ragged

LOOPS = {"naive": naive, "normalized": normalized, "ragged": ragged, "amp": amp, "large_batch": large_batch}

__all__ = ["LOOPS", "amp", "grad_divided", "large_batch", "naive", "normalized", "ragged"]
