"""Lesson 4's two bugs, written out so they can be measured against the oracle: clipping before
``unscale_`` (``clip_before_unscale``) and a scale that changes inside a window
(``scale_changes_mid_window``).

A part of ``mixed_precision.py``, which re-exports both.
"""

from __future__ import annotations

import torch

from accumlib.batches import checked_losses, to_device

from ._mixed_precision_inf import TASK, InfRun, inf_run, inf_table, plot_inf_run  # noqa: F401 (the notebook reads them here)


def clip_before_unscale(model, optimizer, window, item_losses, *, scaler, max_norm, dtype) -> None:
    """THE BUG: clip while .grad still holds S * g, so the clip threshold is S times too small."""
    n = sum(len(b[1]) for b in window)
    dev = next(model.parameters()).device
    for batch in window:
        with torch.autocast(dev.type, dtype=dtype):
            losses = checked_losses(item_losses, model, to_device(batch, dev))
        scaler.scale(losses.float().sum() / n).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # sees S * g, clips it to max_norm
    scaler.step(optimizer)  # then unscales: the window's gradient ends up max_norm / S long
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def scale_changes_mid_window(
    model, optimizer, window, item_losses, *, scaler, change_after, factor, dtype
) -> None:
    """THE BUG: the scale changes after micro-batch ``change_after`` (an ``update()`` inside the window).

    .grad then holds S * g_early + factor * S * g_late, and ``step`` divides all of it by factor * S.
    """
    n = sum(len(b[1]) for b in window)
    dev = next(model.parameters()).device
    for j, batch in enumerate(window):
        with torch.autocast(dev.type, dtype=dtype):
            losses = checked_losses(item_losses, model, to_device(batch, dev))
        scaler.scale(losses.float().sum() / n).backward()
        if j + 1 == change_after:
            scaler.update(scaler.get_scale() * factor)  # what a mid-window update() does when the scale grows
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
