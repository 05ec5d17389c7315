"""Section 9, verify_trainer's cost: ``accumlib.hf.verify_trainer(trainer)`` against ``trainer.train()``
alone.

One epoch of the real transformers Trainer on a tiny Llama built from its config (nothing downloaded):
25 optimizer steps of k = 4 micro-batches of 2 sequences (100 micro-batches, 200 sequences), one
CPU thread. Both runs are timed interleaved, each on a fresh Trainer built outside the timing;
verify_trainer's time includes building its own Trainer on a copy of the model and the large-batch
reference at every step. The issue asks only that the ratio be stated; the goal below is ours.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from _render import md_table
from _timing import interleaved, pair_ratios, ratio_quartiles

NAME = "verify_trainer"
TITLE = "9. verify_trainer's cost: a Trainer epoch of 25 optimizer steps, k = 4"
TIME_MAX = 4.0
LIMIT = TIME_MAX
GOALS = {
    "verify_trainer": "verify_trainer(trainer) / trainer.train() <= 4.0 (median), tiny Llama, 25 optimizer "
    "steps of k = 4"
}
K, B = 4, 2  # 4 micro-batches of 2 sequences per optimizer step


STEPS, QUICK_STEPS = 25, 2  # optimizer steps per epoch
REPEATS, QUICK_REPEATS = 5, 1  # interleaved pairs


def run(quick: bool = False) -> dict:
    """Median over interleaved pairs of verify_trainer(trainer) / trainer.train() on one epoch."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model from its config needs no hub
    try:
        from transformers import PrinterCallback, Trainer, TrainingArguments

        from accumlib.hf import verify_trainer
        from accumlib_course.examples.data import collate, token_sequences
        from accumlib_course.survey import tiny_model
    except ImportError as err:
        return {
            "not_available": f"transformers / accumlib.hf cannot be imported ({err}): pip install "
            "accumlib[hf]"
        }
    steps = QUICK_STEPS if quick else STEPS
    repeats = QUICK_REPEATS if quick else REPEATS
    data = token_sequences(n=steps * K * B)
    reports = []

    with tempfile.TemporaryDirectory(prefix="accumlib-bench-") as out:

        def trainer() -> Any:
            args = TrainingArguments(
                output_dir=out,
                per_device_train_batch_size=B,
                gradient_accumulation_steps=K,
                num_train_epochs=1,
                use_cpu=True,
                report_to=[],
                disable_tqdm=True,
                logging_strategy="no",
                save_strategy="no",
            )
            t = Trainer(model=tiny_model("llama"), args=args, train_dataset=data, data_collator=collate)
            t.remove_callback(PrinterCallback)  # its end-of-training metrics line, printed once per run
            return t

        def alone() -> Callable[[], Any]:
            t = trainer()
            return t.train

        def verified() -> Callable[[], Any]:
            t = trainer()
            return lambda: reports.append(verify_trainer(t))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = interleaved({"verify_trainer": verified, "train": alone}, repeats)
    ratio = pair_ratios(t["verify_trainer"], t["train"])
    report = reports[-1]
    row = {
        "model": "LlamaForCausalLM (tiny, from its config)",
        "steps": len(report.steps),
        "micro_batches": steps * K,
        "alone_s": statistics.median(t["train"]),
        "verify_s": statistics.median(t["verify_trainer"]),
        "ratio": ratio,
        "ratio_quartiles": ratio_quartiles(t["verify_trainer"], t["train"]),
        "verdict_ok": bool(report.ok),
        "repeats": repeats,
        "met": ratio <= TIME_MAX,
    }
    goal = {
        "measured": f"{ratio:.2f}x ({row['verify_s']:.2f} s / {row['alone_s']:.2f} s)",
        "met": None if quick else row["met"],
        "missed": [] if quick or row["met"] else [f"{ratio:.2f}x"],
    }
    return {
        "rows": [row],
        "goals": {"verify_trainer": goal},
        "note": "median over interleaved pairs of (verify_trainer(trainer) / trainer.train()), each on a "
        "fresh Trainer built outside the timing; one epoch with the Trainer's own AdamW, one CPU thread"
        + ("; --quick: 2 steps, 1 repeat, no verdict" if quick else ""),
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection, here the same)."""
    return md_table(
        [
            "model",
            "steps (micro-batches)",
            "trainer.train()",
            "verify_trainer",
            "ratio [quartiles]",
            "verdict",
            f"goal <= {TIME_MAX:g}x",
        ],
        [
            [
                r["model"],
                f"{r['steps']} ({r['micro_batches']})",
                f"{r['alone_s']:.2f} s",
                f"{r['verify_s']:.2f} s",
                f"{r['ratio']:.2f}x [{r['ratio_quartiles'][0]:.2f}, {r['ratio_quartiles'][1]:.2f}]",
                "ok" if r["verdict_ok"] else "NOT ok",
                "met" if r["met"] else "MISSED",
            ]
            for r in res["rows"]
        ],
    )
