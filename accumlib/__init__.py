"""accumlib: gradient accumulation in PyTorch, checked against the true large-batch gradient.

The public surface is re-exported here; modules starting with ``_`` are private.
"""

from ._batch import cat_batches, count_items, resolve_device, windows
from .check import CheckTable, Trace, check_reference_loops, classify, trace_loop
from .compare import Comparison, compare
from .data import TokenSequences, count_tokens, digits, pad_collate, synthetic_classification
from .loops import LOOPS, amp, grad_divided, large_batch, naive, normalized, ragged
from .memory import activation_bytes, cuda_peak_bytes
from .models import MLP, SmallCNN, TinyLM
from .oracle import grads_of, true_gradient
from .tasks import TASKS, Task, classification_losses, get_task, token_losses
from . import distributed  # DDP accumulation; importing it starts no process and no process group
from .distributed import ddp_accumulate

__version__ = "0.1.0"

__all__ = [
    "LOOPS", "MLP", "TASKS", "CheckTable", "Comparison", "SmallCNN", "Task", "TinyLM", "TokenSequences", "Trace",
    "activation_bytes", "amp", "cat_batches", "check_reference_loops", "classification_losses", "classify",
    "compare", "count_items", "count_tokens", "cuda_peak_bytes", "digits", "get_task", "grad_divided", "grads_of", "large_batch",
    "naive", "normalized", "pad_collate", "ragged", "resolve_device", "synthetic_classification", "token_losses",
    "trace_loop", "true_gradient", "windows",
]
__all__ += ["ddp_accumulate", "distributed"]
# accumlib.verify is the function; its implementation is the private package accumlib._verify
from ._verify import CODES, Finding, Report, StepRow, verify  # noqa: E402
from .gallery import GALLERY, GalleryLoop  # noqa: E402

__all__ += ["CODES", "Finding", "GALLERY", "GalleryLoop", "Report", "StepRow", "verify"]
