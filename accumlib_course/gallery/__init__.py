"""A gallery of user-style training loops, each with the verdict ``accumlib.verify`` must give.

Every loop is ``train_fn(model, optimizer, loader)``, written the way people write them
(criterion means, ``loss / K``, ``(i + 1) % K``), for classification batches ``(x, y)``
and ``K = 4``. ``GALLERY[name].run()`` verifies one on its dataset:

>>> from accumlib_course.gallery import GALLERY
>>> sorted(GALLERY["last-batch-step"].run().codes)
['mean-of-means', 'tail-misscaled']

The loops of the sources the course cites (a BERT fine-tuning post, the MindSpore tutorial, a blog
post's extra step for the last batch, the GAN article, the Stack Overflow thread) are ported to torch and
a tiny model, named by what they do; the rest trigger one finding code each (``bug-*``), or must
pass (``correct-*``). The keys these loops had before (``seed-000-bert`` ...) still look them up
(``LEGACY_NAMES``) but are not listed.

One module per origin: ``seeds`` (the posts and the tutorial), ``stackoverflow`` (the thread),
``bugs``, ``correct`` and ``frameworks`` (Accelerate, Lightning); the registry is here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accumlib import Report, verify
from accumlib.data import digits
from accumlib.models import MLP
from accumlib.tasks import get_task

from ._common import CLIP, K
from .bugs import (
    bug_clip_before_unscale,
    bug_clip_per_micro_batch,
    bug_constant_divisor,
    bug_early_step,
    bug_frozen_inside_window,
    bug_labels_before_shift,
    bug_late_step,
    bug_logged_loss_scaled,
    bug_misscaled,
    bug_no_zero_grad,
    bug_scale_changed_inside_window,
    bug_scheduler_per_micro_batch,
    bug_tail_misscaled,
    bug_unscaled_sum,
    bug_zero_grad_inside_window,
)
from .correct import (
    clip_by_total_norm,
    correct_amp_clip_scheduler,
    correct_drop_last,
    correct_enumerate,
    correct_gradual_unfreezing,
    correct_inner_for,
    correct_nanogpt,
    correct_own_clip,
    correct_with_replacement,
)
from .frameworks import accelerate_loop, lightning_loop
from .seeds import (
    Accumulator,
    bert_style_epoch,
    bert_train_one_epoch,
    gan_grad_divided,
    gan_loss_divided,
    last_batch_step,
    mindspore_accumulator,
)
from .stackoverflow import (
    divide_by_window_batches,
    stackoverflow_answer,
    stackoverflow_question,
    stackoverflow_question_last_batch,
    step_at_end,
    step_every_k,
)


@dataclass(frozen=True)
class GalleryLoop:
    """A loop, the codes ``verify`` must find on it (empty: correct), and where it comes from."""

    fn: Callable[..., Any]
    expected_codes: frozenset[str]
    source_note: str
    task: str = "mlp-digits"
    n_items: int | None = None  # None: the task's own dataset; else the first n digits
    dropout: float = 0.0

    @property
    def source(self) -> str:
        """The loop's code, for display."""
        return inspect.getsource(self.fn)

    def run(self, oracle: str = "auto") -> Report:
        """Verify this loop on its task with ``accum_steps=K``, the task's batch size and plain SGD
        (``oracle``: ``accumlib.verify``'s)."""
        t = get_task(self.task)
        model = MLP(dropout=self.dropout) if self.dropout else t.make_model(0)
        data = t.make_dataset() if self.n_items is None else digits(self.n_items, image="cnn" in self.task)
        return verify(
            self.fn,
            model=model,
            dataset=data,
            item_losses=t.item_losses,
            accum_steps=K,
            batch_size=t.batch_size,
            collate_fn=t.collate_fn,
            oracle=oracle,
        )


class _Gallery(dict):
    """The registry: a dict whose former keys (``LEGACY_NAMES``) still look a loop up, unlisted."""

    def __missing__(self, key: str) -> GalleryLoop:
        if key in LEGACY_NAMES:
            return self[LEGACY_NAMES[key]]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (isinstance(key, str) and LEGACY_NAMES.get(key) in self.keys())


LEGACY_NAMES: dict[str, str] = {
    "seed-000-bert": "bert-train-one-epoch",
    "seed-001-mindspore": "mindspore-accumulator",
    "seed-002-last-batch": "last-batch-step",
    "seed-003-gan-normalized": "gan-loss-divided",
    "seed-003-gan-grad-division": "gan-grad-divided",
    "seed-004-question": "stackoverflow-question",
    "seed-004-question-last-batch": "stackoverflow-question-last-batch",
    "seed-004-answer": "stackoverflow-answer",
}

_E = frozenset
GALLERY: dict[str, GalleryLoop] = _Gallery(
    {
        "bert-train-one-epoch": GalleryLoop(
            bert_style_epoch,
            _E({"tail-dropped", "logged-loss-scaled"}),
            "How Gradient accumulation is implemented (BERT post): train_one_epoch; 110 items leave a "
            "2-micro-batch tail it never steps",
        ),
        "mindspore-accumulator": GalleryLoop(
            mindspore_accumulator,
            _E({"tail-dropped"}),
            "MindSpore tutorial: its Accumulator ported to torch; counter % K never fires for the tail",
        ),
        "last-batch-step": GalleryLoop(
            last_batch_step,
            _E({"tail-misscaled", "mean-of-means"}),
            "Gradient Accumulation explained (blog post): the extra step for the last batch divides a "
            "2-batch tail (8 + 6 items) by K",
        ),
        "gan-loss-divided": GalleryLoop(
            gan_loss_divided, _E(), "GAN article: loss / n_accumulation_steps", n_items=128
        ),
        "gan-grad-divided": GalleryLoop(
            gan_grad_divided, _E(), "GAN article: p.grad / n once per window", n_items=128
        ),
        "stackoverflow-question": GalleryLoop(
            stackoverflow_question, _E({"tail-dropped"}), "Stack Overflow question: its GradScaler loop"
        ),
        "stackoverflow-question-last-batch": GalleryLoop(
            stackoverflow_question_last_batch,
            _E({"tail-misscaled", "mean-of-means"}),
            "Stack Overflow question: the asker's `or (i + 1) == len(data)`",
        ),
        "stackoverflow-answer": GalleryLoop(
            stackoverflow_answer,
            _E({"mean-of-means"}),
            "Stack Overflow answer: divides by the window's micro-batch count, not its items (8 + 6)",
        ),
        "bug-unscaled-sum": GalleryLoop(
            bug_unscaled_sum, _E({"unscaled-sum"}), "loss never divided", n_items=128
        ),
        "bug-tail-misscaled": GalleryLoop(
            bug_tail_misscaled, _E({"tail-misscaled"}), "a 2 x 8-item tail divided by K", n_items=112
        ),
        "bug-zero-grad-inside-window": GalleryLoop(
            bug_zero_grad_inside_window,
            _E({"zero-grad-inside-window"}),
            "zero_grad every micro-batch",
            n_items=128,
        ),
        "bug-no-zero-grad": GalleryLoop(
            bug_no_zero_grad, _E({"no-zero-grad"}), "zero_grad forgotten", n_items=128
        ),
        "bug-early-step": GalleryLoop(
            bug_early_step, _E({"early-step"}), "step every micro-batch", n_items=128
        ),
        "bug-late-step": GalleryLoop(
            bug_late_step, _E({"late-step"}), "one step per epoch, loss / K", n_items=128
        ),
        "bug-scheduler-per-micro-batch": GalleryLoop(
            bug_scheduler_per_micro_batch,
            _E({"scheduler-per-micro-batch"}),
            "scheduler.step() per micro-batch",
            n_items=128,
        ),
        "bug-clip-per-micro-batch": GalleryLoop(
            bug_clip_per_micro_batch, _E({"clip-per-micro-batch"}), "clip after every backward", n_items=128
        ),
        "bug-clip-before-unscale": GalleryLoop(
            bug_clip_before_unscale,
            _E({"clip-before-unscale"}),
            "GradScaler without unscale_ before clipping",
            n_items=128,
        ),
        "bug-scale-changed-inside-window": GalleryLoop(
            bug_scale_changed_inside_window,
            _E({"scale-changed-inside-window"}),
            "GradScaler's scale changed between the window's backwards",
            n_items=128,
        ),
        "bug-logged-loss-scaled": GalleryLoop(
            bug_logged_loss_scaled, _E({"logged-loss-scaled"}), "reports the divided loss", n_items=128
        ),
        "bug-misscaled": GalleryLoop(
            bug_misscaled, _E({"misscaled"}), "loss / (1.04 x the window's items)", n_items=128
        ),
        "bug-labels-before-shift": GalleryLoop(
            bug_labels_before_shift,
            _E({"misscaled"}),
            "a causal LM divided by its labels counted before the shift",
            task="lm-tokens",
        ),
        "bug-constant-divisor": GalleryLoop(
            bug_constant_divisor,
            _E({"misscaled"}),
            "every window divided by one fixed token budget, not its own count",
            task="lm-tokens",
        ),
        "bug-frozen-inside-window": GalleryLoop(
            bug_frozen_inside_window,
            _E({"frozen-inside-window"}),
            "a layer unfrozen halfway through a window",
            n_items=128,
        ),
        "bug-batchnorm": GalleryLoop(
            correct_inner_for, _E({"batchnorm"}), "a correct loop on a BatchNorm CNN", task="cnn-batchnorm"
        ),
        "bug-dropout-unscaled": GalleryLoop(
            bug_unscaled_sum,
            _E({"unscaled-sum", "dropout"}),
            "a real bug under dropout",
            n_items=128,
            dropout=0.3,
        ),
        "correct-dropout": GalleryLoop(
            correct_inner_for, _E({"dropout"}), "a correct loop; dropout is a note, not a bug", dropout=0.3
        ),
        "correct-enumerate": GalleryLoop(correct_enumerate, _E(), "enumerate, items counted, tail stepped"),
        "correct-inner-for": GalleryLoop(correct_inner_for, _E(), "inner for over each window"),
        "correct-nanogpt": GalleryLoop(
            correct_nanogpt, _E(), "nanoGPT-style prefetch, unscale then clip", n_items=128
        ),
        "correct-amp-clip-scheduler": GalleryLoop(
            correct_amp_clip_scheduler, _E(), "autocast, GradScaler, clip, scheduler, tqdm"
        ),
        "correct-own-clip": GalleryLoop(
            correct_own_clip, _E({"clip-assumed"}), "a clip of its own (fairseq, DeepSpeed): assumed, said so"
        ),
        "correct-gradual-unfreezing": GalleryLoop(
            correct_gradual_unfreezing, _E(), "a layer unfrozen at a step", n_items=128
        ),
        "correct-drop-last": GalleryLoop(
            correct_drop_last,
            _E({"loader-left-out"}),
            "drop_last=True: the partial micro-batch left out, said so",
        ),
        "correct-with-replacement": GalleryLoop(
            correct_with_replacement,
            _E({"duplicate-items", "loader-left-out"}),
            "a sampler with replacement: repeats and gaps, counted",
        ),
        "correct-groupnorm": GalleryLoop(
            correct_inner_for, _E(), "the BatchNorm CNN's loop with GroupNorm", task="cnn-groupnorm"
        ),
        "accelerate": GalleryLoop(
            accelerate_loop, _E(), "Accelerate accumulate(), 128 items: full windows", n_items=128
        ),
        "accelerate-tail": GalleryLoop(
            accelerate_loop,
            _E({"tail-misscaled", "mean-of-means"}),
            "Accelerate steps the tail at the end of the loader but divides it by K",
        ),
        "lightning": GalleryLoop(
            lightning_loop, _E(), "Lightning accumulate_grad_batches, 128 items: full windows", n_items=128
        ),
        "lightning-tail": GalleryLoop(
            lightning_loop,
            _E({"tail-misscaled", "mean-of-means"}),
            "Lightning steps on the final batch but divides it by accumulate_grad_batches",
        ),
    }
)

__all__ = [
    "CLIP",
    "GALLERY",
    "LEGACY_NAMES",
    "GalleryLoop",
    "K",
    "Accumulator",
    "bert_train_one_epoch",
    "clip_by_total_norm",
    "divide_by_window_batches",
    "step_at_end",
    "step_every_k",
]
