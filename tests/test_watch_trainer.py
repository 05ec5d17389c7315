"""Transformers' own ``Trainer.train()`` under ``accumlib.watch`` (what ``accumlib run`` does to a script that
builds a Trainer), over two epochs of 11 micro-batches (windows 4, 4, 3 each), judged against the test's
own count of what each step was fed (``test_verify_transformers.Windows``: the labels of every forward).

Each epoch's 3-micro-batch window is that pass's tail: before watch read the DataLoader's passes, it was
named ``early-step`` in the first epoch. Llama's loss takes the Trainer's ``num_items_in_batch``: every
step is the true large-batch gradient. GPT-2's does not (transformers 5.23: its forward has no ``**kwargs``
for the count, so the Trainer divides by micro-batch counts taken before the causal shift): every step is
c = N / (N + S), N the predicted tokens and S the sequences of the window.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers is in the test extra (pip install -e .[test])")

import test_verify_transformers as tv  # noqa: E402
from transformers import Trainer  # noqa: E402

from accumlib._verify.watch import watch  # noqa: E402
from accumlib.tolerances import FIT_RTOL, FLOAT32_RTOL  # noqa: E402

EPOCHS = 2


def train(name: str, output_dir):
    tv.reset_accelerate()
    model, fed = tv.MODELS[name](), tv.Windows()
    hooks = fed.attach(model)
    try:
        with watch() as seen:
            # no clipping: each step's gradient is the accumulated one as is
            args = tv.training_args(output_dir, num_train_epochs=EPOCHS, max_grad_norm=0.0)
            Trainer(model=model, args=args, train_dataset=tv.DATA, data_collator=tv.collate).train()
    finally:
        for h in hooks:
            h.remove()
        tv.reset_accelerate()
    return seen.report, fed.counts()


def test_llama_over_two_epochs_is_exact_and_each_tail_ends_its_pass(tmp_path):
    report, counts = train("llama", tmp_path)
    assert report.ok and report.codes == set(), report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * EPOCHS
    assert [r.items for r in report.steps] == [n for n, _ in counts]  # the test's own count of tokens
    assert report.accum_steps == tv.K and max(r.rel_error for r in report.steps) < FLOAT32_RTOL


def test_gpt2_over_two_epochs_is_misscaled_by_n_over_n_plus_s_at_every_step(tmp_path):
    report, counts = train("gpt2", tmp_path)
    assert not report.ok and report.codes == {"misscaled"}, report
    assert [r.micro_batches for r in report.steps] == [4, 4, 3] * EPOCHS  # no early-step at the tails
    for row, (n, s) in zip(report.steps, counts, strict=True):
        assert row.factor == pytest.approx(n / (n + s), rel=FIT_RTOL), (row, n, s)
