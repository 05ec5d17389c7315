"""Lesson 9's widget and exercise: the Transformers Trainer on a tiny causal LM, under verify_trainer.

``trainer_run(model_type)`` builds the class tiny from its config (``accumlib_course.survey.tiny_model``),
runs the Trainer's own loop under ``accumlib.hf.verify_trainer`` (22 sequences, micro-batches of 2,
k = 4: about a second) and sets the packaged survey's row beside it. ``widget()`` offers it for a
handful of classes, one per outcome the survey found. ``EXERCISE`` grades a Trainer configuration.
"""

from __future__ import annotations

import functools
import html
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accumlib.checks import check_choice
from accumlib.text import Table

from .. import _style
from ._common import long_lived_objects_frozen
from ._exercise import Exercise

# One class per outcome of the survey: GPT-2 and CTRL count labels before the shift, Llama, Qwen2 and
# OPT are exact, BART's causal LM returns a mean the Trainer never divides.
MODEL_TYPES = ("gpt2", "llama", "qwen2", "opt", "ctrl", "bart")


@dataclass
class TrainerRun:
    """One live Trainer run: the class, verify's report, and what the packaged survey says of it."""

    model_type: str
    model_class: str
    report: Any
    survey: str  # the survey's row in words, or why there is none

    @property
    def verdict(self) -> str:
        codes = ", ".join(sorted(self.report.codes)) or "no finding"
        return f"{self.model_class}: {'ok' if self.report.ok else 'NOT OK'} ({codes})"

    def steps(self) -> Table:
        rows = [
            (
                r.step,
                r.micro_batches,
                r.items,
                f"{r.factor:.4f}",
                f"{r.rel_error:.1e}",
                ", ".join(r.codes) or "ok",
            )
            for r in self.report.steps
        ]
        return Table(("step", "micro-batches", "tokens", "c", "rel. error", "codes"), rows)

    def __str__(self) -> str:
        return f"{self.verdict}\n{self.steps()}\nsurvey: {self.survey}"

    def _repr_html_(self) -> str:
        colour = _style.BLUE if self.report.ok else _style.VERMILLION
        return (
            f"<p style='color:{colour}'><b>{html.escape(self.verdict)}</b></p>{self.steps()._repr_html_()}"
            f"<p>The packaged survey: {html.escape(self.survey)}</p>"
        )


def _survey_says(model_type: str) -> str:
    from accumlib_course import survey

    try:
        table = survey.load("causal-lm")
    except survey.NoTable as err:
        return str(err)
    row = next((r for r in table.rows if r.model_type == model_type), None)
    if row is None or row.status != "judged":
        return f"transformers {table.versions['transformers']}: {model_type} not judged"
    c = f", c = {', '.join(f'{x:.4f}' for x in row.factors)}" if row.factors else ""
    return f"transformers {table.versions['transformers']}: {', '.join(row.bugs) or 'exact'}{c}"


@functools.lru_cache(maxsize=len(MODEL_TYPES))
def trainer_run(model_type: str = "gpt2") -> TrainerRun:
    """The Trainer (``real_bugs.make_trainer``) on ``model_type``'s causal LM built tiny, under
    verify_trainer.
    """
    check_choice("model_type", model_type, MODEL_TYPES)
    from accumlib.hf import verify_trainer
    from accumlib_course.survey import TASKS, own_item_losses, tiny_model
    from accumlib_course.survey.run import quiet

    from ._real_bugs_runs import make_trainer

    with quiet():
        model = tiny_model(model_type)
        # the loss the model's own averages (BART's causal LM does not
        # shift its labels), as the survey judges it
        losses = TASKS["causal-lm"].item_losses[own_item_losses(model)]
        with long_lived_objects_frozen():
            report = verify_trainer(make_trainer(model), item_losses=losses)
    return TrainerRun(model_type, type(model).__name__, report, _survey_says(model_type))


class TrainerWidget:
    """A class dropdown and a run button: the Trainer under verify_trainer, its verdict and c per step.

    The button's callback runs on a kernel subshell thread in JupyterLab 4.6: the output area is
    filled by setting its outputs (``_style.show_in``), never with ``with out:``.
    """

    def __init__(self, initial: TrainerRun | None = None, value: str = "gpt2"):
        import ipywidgets as w

        check_choice("value", value, MODEL_TYPES)
        self.model = w.Dropdown(options=list(MODEL_TYPES), value=value, description="model")
        self.button = w.Button(description="run the Trainer", button_style="primary")
        self.out = w.Output()
        self.widget = w.VBox([w.HBox([self.model, self.button]), self.out])
        self.result: TrainerRun | Exception | None = initial
        self.button.on_click(self.run)
        self.model.observe(self._picked, names="value")
        if initial is not None:
            self._show(initial)

    def _show(self, *objs: Any) -> None:
        from ._explorer import in_kernel

        if in_kernel():
            _style.show_in(self.out, *objs)

    def _picked(self, change: Any = None) -> None:
        self._show(f"{self.model.value}: press 'run the Trainer' to train it under verify_trainer")

    def run(self, _: Any = None) -> TrainerRun | Exception:
        self.button.disabled = True
        try:
            self.result = trainer_run(self.model.value)
        except Exception as e:  # shown in the widget: a callback's traceback would reach only the server log
            self.result = e
        finally:
            self.button.disabled = False
        self._show(
            self.result
            if not isinstance(self.result, Exception)
            else f"{type(self.result).__name__}: {self.result}"
        )
        return self.result

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def widget(report: Any = None, value: str = "gpt2") -> TrainerWidget:
    """The widget, showing ``report`` (verify_trainer's report of ``value``'s class, made by the notebook
    with ``make_trainer``) until the first run; None shows nothing until then."""
    check_choice("value", value, MODEL_TYPES)
    if report is not None and not hasattr(report, "steps"):
        raise TypeError(f"report must be an accumlib.Report (got {type(report).__name__})")
    initial = None
    if report is not None:
        from accumlib_course.survey.models import model_mapping

        initial = TrainerRun(value, model_mapping("causal-lm")[value], report, _survey_says(value))
    return TrainerWidget(initial, value)


# --- the exercise: a GPT-2 Trainer with a custom compute_loss_func that returns a mean ---------------
# Two bugs stand in the way, one per finding: the mean is never divided by the Trainer (unscaled-sum),
# and num_items_in_batch counts GPT-2's labels before the shift (misscaled, c = N/(N+S)).


class ConfigError(ValueError):
    """The learner's train_fn did not build the Trainer the exercise grades."""


def _grade_trainer(train_fn: Callable[..., Any]) -> Any:
    """Build a tiny GPT-2, let ``train_fn(model, train_dataset, data_collator, output_dir)`` configure its
    Trainer, and run that Trainer under verify_trainer (nothing is trained: verify works on a copy)."""
    import transformers

    from accumlib.hf import verify_trainer
    from accumlib_course.examples.data import collate, token_sequences
    from accumlib_course.survey import tiny_model
    from accumlib_course.survey.run import quiet

    with quiet(), tempfile.TemporaryDirectory(prefix="accumlib-ex9-") as out:
        model = tiny_model("gpt2")
        trainer = train_fn(model, token_sequences(), collate, out)
        if not isinstance(trainer, transformers.Trainer):
            raise ConfigError(
                f"train_fn must return the transformers.Trainer it builds (got {type(trainer).__name__})"
            )
        if trainer.model is not model:
            raise ConfigError(
                "train_fn must build the Trainer around the GPT-2 it is given (got another model)"
            )
        args = trainer.args
        if (args.gradient_accumulation_steps, args.per_device_train_batch_size) != (4, 2):
            raise ConfigError(
                "keep gradient_accumulation_steps=4 and per_device_train_batch_size=2: the exercise grades "
                f"accumulation (got {args.gradient_accumulation_steps} and "
                f"{args.per_device_train_batch_size})"
            )
        with long_lived_objects_frozen():
            return verify_trainer(trainer)


EXERCISE = Exercise(
    "09-count-after-the-shift",
    "Configure the Trainer (GPT-2, a custom compute_loss_func) so that every step is the true gradient",
    run=_grade_trainer,
    call="real_bugs.EXERCISE",  # as the notebook names it (this module is private)
    hints={
        "misscaled": (
            "c = N/(N+S) at every step: the Trainer divides the summed loss of the window's N predicted "
            "tokens by N + S, one too many per sequence. Which labels does the Trainer count, and what "
            "tells it that GPT-2's loss shifts them?",
            "The Trainer counts labels after the shift only for a model whose `loss_type` attribute names a "
            "loss it knows shifts. GPT-2's is None (its class name matches no loss type). Setting the "
            "config's loss_type after the model is built, or a name the Trainer does not know, leaves the "
            "count unshifted; a compute_loss_func gets the same unshifted num_items_in_batch.",
            "Before building the Trainer: model.loss_type = 'ForCausalLM'. Then the Trainer counts "
            "labels[:, 1:] != -100, the tokens GPT-2's loss sums.",
        ),
        "unscaled-sum": (
            "Every step is about m times the true gradient, m the window's micro-batches: each "
            "micro-batch's mean loss was added up. Who divides by gradient_accumulation_steps when you pass "
            "a compute_loss_func?",
            "With compute_loss_func set, the Trainer no longer divides the loss by "
            "gradient_accumulation_steps: it expects your function to divide by num_items_in_batch, the "
            "window's token count, which it passes in. A mean over one micro-batch's tokens ignores it.",
            "Sum the shifted token losses (reduction='sum') and divide by num_items_in_batch; and set "
            "model.loss_type = 'ForCausalLM' so that the Trainer takes that count after the shift.",
        ),
        "mean-of-means": (
            "Each micro-batch's mean weighs the same, although the micro-batches hold different numbers of "
            "tokens. What does the Trainer pass your compute_loss_func that a per-micro-batch mean throws "
            "away?",
            "num_items_in_batch is the token count of the whole window: divide the micro-batch's summed "
            "token losses by it, and every token weighs 1/N.",
            "reduction='sum' over the shifted tokens, divided by num_items_in_batch; and model.loss_type = "
            "'ForCausalLM' so that the count is taken after the shift.",
        ),
        "unexplained": (
            "The step is no scaled copy of the true gradient: the loss itself changed. Which loss does the "
            "loss_type you set compute?",
            "GPT-2 predicts the next token: its loss must shift the labels. A masked-LM loss compares each "
            "position with its own token.",
            "Use loss_type 'ForCausalLM', the causal LM's loss.",
        ),
        "error": "train_fn(model, train_dataset, data_collator, output_dir) must build and return the "
        "transformers.Trainer (not call train(): the grader runs its loop under verify_trainer), with the "
        "model, data and accumulation settings it is given.",
    },
)
