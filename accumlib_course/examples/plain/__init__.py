"""Plain PyTorch accumulation loops to copy: one file per common case, each importing torch alone.

Every loop implements one identity. For a window of micro-batches b_1..b_m (m <= k, the last window
of an epoch may be shorter) holding N items in all:

    g  =  grad (1/N) sum_{i in window} l_i  =  sum_j grad( sum_{i in b_j} l_i / N )

N is counted over the whole window before its first backward, and the last, partial window is
stepped too, divided by its own N.

- ``fixed_size``: samples of fixed size (classification), N = samples in the window;
- ``tokens``: a causal language model, N = the window's non-ignored (shifted) labels;
- ``amp``: ``fixed_size`` under autocast with a ``GradScaler``, unscaled once before clipping;
- ``ddp``: ``tokens`` under ``DistributedDataParallel``, ``no_sync`` on all micro-batches but the
  window's last, N all-reduced over the ranks.

Lesson 10 shows them, ``tests/test_plain_loops.py`` runs each under ``accumlib.verify``.
"""
