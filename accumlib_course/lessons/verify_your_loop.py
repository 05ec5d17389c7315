"""Lesson 7: verify your own loop with ``accumlib.verify``.

``gallery(...)`` runs ``accumlib.verify`` on loops of ``accumlib_course.gallery.GALLERY`` (the seed
documents' loops among them) and sets what it finds beside what each loop is known to
do; ``check(train_fn)`` verifies a loop on a built-in task; ``paste_box()`` does the
same for a loop pasted as text.
"""

from __future__ import annotations

import functools
import html
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

import accumlib
import accumlib_course.gallery
from accumlib.checks import check_choice, check_int
from accumlib.text import Table

from .. import _style
from ._exercise import Exercise

# Lightning's Trainer prints its own log lines and takes seconds to import; the table
# leaves its two loops out by default (the dropdown still offers them).
SLOW = ("lightning", "lightning-tail")


@dataclass
class Row:
    name: str
    note: str
    expected: frozenset[str]
    found: frozenset[str]
    ok: bool

    @property
    def agrees(self) -> bool:
        return self.found == self.expected


@dataclass
class GalleryTable:
    rows: list[Row]

    @property
    def codes(self) -> list[str]:
        """Every code found or expected in the table, in ``accumlib.verify``'s order."""
        from accumlib import CODES

        seen = set().union(*(r.found | r.expected for r in self.rows))
        return [c for c in CODES if c in seen]

    def __str__(self) -> str:
        width = max(len(r.name) for r in self.rows)
        lines = [f"{'loop':<{width}}  {'ok':<5}  found (= expected unless marked)"]
        for r in self.rows:
            found = ", ".join(sorted(r.found)) or "-"
            mark = "" if r.agrees else f"   <-- expected {sorted(r.expected)}"
            lines.append(f"{r.name:<{width}}  {str(r.ok):<5}  {found}{mark}")
        agree = sum(r.agrees for r in self.rows)
        lines.append(f"\n{agree}/{len(self.rows)} loops get exactly their expected findings")
        return "\n".join(lines)

    def table(self) -> Table:
        """The rows as a table (HTML in JupyterLab): loop, verdict, codes found, whether they are the
        expected ones.
        """
        rows = [
            (
                r.name,
                "ok" if r.ok else "NOT OK",
                ", ".join(sorted(r.found)) or "-",
                "yes" if r.agrees else f"no, expected {', '.join(sorted(r.expected)) or '-'}",
            )
            for r in self.rows
        ]
        agree = sum(r.agrees for r in self.rows)
        return Table(
            ("loop", "verdict", "found", "as expected"),
            rows,
            caption=f"accumlib.verify on the gallery: {agree}/{len(self.rows)} loops get exactly their "
            f"expected findings",
        )


def gallery(names: list[str] | None = None, skip: tuple[str, ...] = SLOW) -> GalleryTable:
    """``accumlib.verify`` on each gallery loop (all but ``skip`` when ``names`` is None).

    >>> gallery(["no-such-loop"])
    Traceback (most recent call last):
    ...
    ValueError: names must be keys of accumlib_course.gallery.GALLERY (got 'no-such-loop')
    """
    names = names if names is not None else [n for n in accumlib_course.gallery.GALLERY if n not in skip]
    for name in names:
        if name not in accumlib_course.gallery.GALLERY:
            raise ValueError(f"names must be keys of accumlib_course.gallery.GALLERY (got {name!r})")
    rows = []
    for name in names:
        loop = accumlib_course.gallery.GALLERY[name]
        report = loop.run()
        rows.append(
            Row(name, loop.source_note, frozenset(loop.expected_codes), frozenset(report.codes), report.ok)
        )
    return GalleryTable(rows)


compute = gallery  # the lesson's main computation, under the name every lesson uses


@_style.styled
def plot(table: GalleryTable) -> Figure:
    """Loops x codes: a filled marker where verify found the code, a ring where it was expected."""
    codes = table.codes
    fig, ax = _style.figure(
        width=2.6 + 0.5 * len(codes),
        height=1.6 + 0.3 * len(table.rows),
        title="What accumlib.verify finds in each gallery loop (ring: expected; filled: found)",
    )
    found_ok, found_bad = _style.ROLE["correct"], _style.ROLE["buggy"]
    for i, r in enumerate(table.rows):
        for j, c in enumerate(codes):
            if c in r.expected:
                ax.scatter(j, i, s=150, facecolors="none", edgecolors=_style.BLACK, linewidths=1)
            if c in r.found:
                role = found_ok if c in r.expected else found_bad
                ax.scatter(j, i, s=45, color=role["color"], marker=role["marker"])
        if r.ok:
            ax.text(len(codes) - 0.3, i, "ok", va="center")
    ax.set_xticks(range(len(codes)), codes, rotation=60, ha="right")
    ax.set_yticks(range(len(table.rows)), [r.name for r in table.rows])
    ax.set_xlim(-0.5, len(codes) + 0.4)
    ax.invert_yaxis()
    ax.scatter([], [], s=45, label="found, as expected", color=found_ok["color"], marker=found_ok["marker"])
    ax.scatter(
        [], [], s=45, label="found, not expected", color=found_bad["color"], marker=found_bad["marker"]
    )
    fig.legend(loc="outside lower center", ncols=2)
    return fig


def check(
    train_fn: Any, task: str = "mlp-digits", accum_steps: int = 4, batch_size: int | None = None
) -> Any:
    """``accumlib.verify`` on a built-in task: a fresh model (seed 0), its dataset, plain SGD.

    ``mlp-digits`` has 110 digits, so with batch 8 and k = 4 the last window holds 2
    micro-batches of 8 and 6: the case most loops get wrong.
    """
    check_choice("task", task, tuple(accumlib.TASKS))
    accum_steps = check_int("accum_steps", accum_steps, low=1)
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size, low=1)
    t = accumlib.get_task(task)
    return accumlib.verify(
        train_fn,
        model=t.make_model(0),
        dataset=t.make_dataset(),
        item_losses=t.item_losses,
        accum_steps=accum_steps,
        batch_size=batch_size or t.batch_size,
        collate_fn=t.collate_fn,
    )


@dataclass
class Verified:
    """A loop's source and its report, shown together."""

    name: str
    source: str
    report: Any

    def __str__(self) -> str:
        return f"{self.name}\n\n{self.source}\n{self.report}"

    def _repr_html_(self) -> str:
        source = html.escape(self.source)
        return f"<h4>{html.escape(self.name)}</h4><pre>{source}</pre>{self.report._repr_html_()}"


def run_gallery_loop(name: str) -> Verified:
    if name not in accumlib_course.gallery.GALLERY:
        raise ValueError(f"name must be a key of accumlib_course.gallery.GALLERY (got {name!r})")
    loop = accumlib_course.gallery.GALLERY[name]
    return Verified(f"{name}: {loop.source_note}", inspect.getsource(loop.fn), loop.run())


def gallery_explorer(initial: Verified | None = None, value: str = "last-batch-step") -> Any:
    """A dropdown of every gallery loop; shows its source and re-runs ``accumlib.verify`` on it."""
    import ipywidgets as w

    from ._explorer import Explorer

    return Explorer(
        _run_gallery_loop_cached,
        lambda v: v,
        initial=initial,
        name=w.Dropdown(
            options=list(accumlib_course.gallery.GALLERY),
            value=value,
            description="loop",
            layout=w.Layout(width="420px"),
        ),
    )


widget = gallery_explorer


@functools.lru_cache(maxsize=64)
def _run_gallery_loop_cached(name: str) -> Verified:
    return run_gallery_loop(name)


# --- paste a loop ----------------------------------------------------------------------------------

EXAMPLE = """\
import torch
import torch.nn.functional as F

def train_fn(model, optimizer, loader):
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def loop_from_source(source: str, name: str = "train_fn") -> Any:
    """Run pasted code in a fresh namespace and return its ``train_fn(model, optimizer, loader)``."""
    namespace: dict[str, Any] = {}
    # the reader's own code, on purpose
    exec(compile(textwrap.dedent(source), "<pasted loop>", "exec"), namespace)
    fn = namespace.get(name)
    if not callable(fn):
        raise ValueError(
            f"the pasted code must define a function {name}(model, optimizer, loader) (found none)"
        )
    return fn


class PasteBox:
    """A textarea for a loop, a task dropdown, a button: ``verify`` on the pasted ``train_fn``."""

    def __init__(self, source: str = EXAMPLE, task: str = "mlp-digits"):
        import ipywidgets as w

        self.text = w.Textarea(value=source, layout=w.Layout(width="95%", height="220px"))
        self.task = w.Dropdown(
            options=["mlp-digits", "cnn-groupnorm", "cnn-batchnorm"], value=task, description="task"
        )
        self.button = w.Button(description="verify", button_style="primary")
        self.out = w.Output()
        self.widget = w.VBox([self.text, w.HBox([self.task, self.button]), self.out])
        self.result: Any = None
        self.button.on_click(self.run)

    def run(self, _: Any = None) -> Any:
        """Verify the pasted loop; a loop that fails to compile or run leaves its error as the result."""
        from IPython.display import display

        from ._explorer import in_kernel

        try:
            self.result = check(loop_from_source(self.text.value), task=self.task.value)
        except Exception as e:  # the reader's code: show what went wrong instead of a dead button
            self.result = e
        if not in_kernel():
            return self.result  # no frontend (pytest): the result is what a test checks
        with self.out:
            self.out.clear_output(wait=True)
            if isinstance(self.result, Exception):
                print(f"{type(self.result).__name__}: {self.result}")
            else:
                display(self.result)
        return self.result

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def paste_box(source: str = EXAMPLE) -> PasteBox:
    return PasteBox(source)


# --- the exercise: paste your own loop; verify grades it, with a nudge and a remedy for every finding ----


def _own_loop_dataset() -> Any:
    """128 digits: 4 full windows of 4 x 8."""
    return accumlib.data.digits(128)


def _own_loop_hints() -> dict[str, str | tuple[str, ...]]:
    """A pasted loop can hold any bug: a nudge and verify's own remedy for every code, and written hints for
    the
    starting loop's (a warmup scheduler stepped per micro-batch, the divided loss logged)."""
    from accumlib import CODES

    hints: dict[str, str | tuple[str, ...]] = {
        code: (
            "Read the finding: it names the steps it concerns. Compare your loop at those steps with a loop "
            "of the gallery that verify passes.",
            f"In general terms: {c.message.split(' (')[0]}.",
            f"verify's remedy: {c.fix}.",
        )
        for code, c in CODES.items()
        if c.kind in ("bug", "limit")
    }
    hints.update(
        {
            "scheduler-per-micro-batch": (
                "The learning rate changed between micro-batches of one window: the scheduler counts "
                "micro-batches.",
                "A schedule (warmup, decay) is written in optimizer steps: the large batch changes its "
                "learning rate only between steps, so every micro-batch of a window must see the same one.",
                "Move scheduler.step() inside the if, right after scaler.step(optimizer) and "
                "scaler.update().",
            ),
            "logged-loss-scaled": (
                "The gradient may be right; the loss the loop reports is k times too small.",
                "The reported loss adds up loss after it was divided for backward().",
                "Log the undivided micro-batch mean: keep the division only in what goes backward, e.g. "
                "running_loss += loss.item() * accum_steps.",
            ),
            "logged-loss-wrong": (
                "The loss the loop reports is not the mean loss over the epoch's items (the verdict gives "
                "both).",
                "Every micro-batch's undivided mean, weighted by its item count, over all items of the "
                "epoch.",
                "running_loss += mean.item() * len(y); n_items += len(y); return running_loss / n_items.",
            ),
            "misscaled@last": (
                "Only the last step is off, by the factor c the verdict gives: the full windows are right.",
                "A last window shorter than the others (your data's tail, or a loop that steps at the end) "
                "holds fewer items than a full one: what does your loop divide its losses by?",
                "Divide the last window's summed item losses by its own item count, not by a full window's.",
            ),
            "untracked-data": (
                "Your loop trained on data of its own, not the loader train_fn receives, so verify could "
                "not judge those steps.",
                "verify follows the items it hands your loop.",
                "Iterate the loader argument (for x, y in loader) where your loop had its own DataLoader.",
            ),
            "error": (
                "Your loop raised an error: read its last line. A pasted loop often needs its names adapted: "
                "the model, the optimizer and the loader are train_fn's arguments, and each batch is (x, y)."
            ),
        }
    )
    return hints


EXERCISE = Exercise(
    "07-paste-your-own-loop",
    "Paste your own training loop and make verify pass it",
    task="mlp-digits",
    accum_steps=4,
    batch_size=8,
    # 4 full windows of 4 x 8 digits: your loop's shape is judged, not a ragged tail
    make_dataset=_own_loop_dataset,
    call="vl.EXERCISE",
    logged_loss="if-returned",  # a loop that reports its epoch loss is graded on it too
    hints=_own_loop_hints(),
)
