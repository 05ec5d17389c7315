"""What a loop does, observed from outside it: the hooks verify itself uses, for code beside it.

The course's graders watch a learner's loop with the same observers verify records with, so that a
grader and verify never disagree on what the loop did (``accumlib_course`` imports only public
modules of the core).

``on_clip(listener)`` calls ``listener(params, max_norm, total_norm)`` after every gradient clip by
norm torch performs while the context is open, whatever name the loop imported the clip by
(``accumlib/_verify/clips.py`` says how).

>>> import torch
>>> from torch.nn.utils import clip_grad_norm_
>>> w = torch.nn.Parameter(torch.ones(4)); w.grad = torch.full((4,), 3.0)
>>> seen = []
>>> with on_clip(lambda ps, max_norm, total: seen.append(max_norm)):
...     _ = clip_grad_norm_([w], 1.0)
>>> seen
[1.0]
"""

from __future__ import annotations

from ._verify.clips import on_clip

__all__ = ["on_clip"]
