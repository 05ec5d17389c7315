"""The course map: every lesson with what it teaches, its time, its prerequisites, and two routes.

``notebooks/00_start_here.ipynb`` shows ``table()`` and the routes; ``tests/test_course.py``
checks that this list, the notebooks' titles and their "Next" links agree. To add a lesson:
add its notebook, its ``accumlib/lessons/<lesson>.py``, and one ``Lesson`` here.

Times are planned workshop minutes (reading, running, the exercise and the questions),
not measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ._common import Table


@dataclass(frozen=True)
class Lesson:
    number: int
    file: str
    title: str
    teaches: str
    minutes: int
    requires: tuple[int, ...] = ()


COURSE: tuple[Lesson, ...] = (
    Lesson(1, "01_why_accumulate.ipynb", "Why accumulate gradients?",
           "memory per micro-batch; k micro-batches give the large batch's gradient", 20),
    Lesson(2, "02_normalizing_the_loss.ipynb", "Normalizing the loss",
           "the naive sum is k times too large; three correct ways to divide", 25, (1,)),
    Lesson(3, "03_ragged_windows_and_tokens.ipynb", "Ragged windows and token counts",
           "the short last window; micro-batches with different token counts", 25, (2,)),
    Lesson(4, "04_mixed_precision.ipynb", "Mixed precision: GradScaler inside an accumulation window",
           "scale, unscale_, clip, step, update: where each goes in a window", 20, (2,)),
    Lesson(5, "05_batchnorm_vs_groupnorm.ipynb", "BatchNorm vs GroupNorm under accumulation",
           "why BatchNorm's statistics per micro-batch break exactness, and what GroupNorm changes", 20, (2,)),
    Lesson(6, "06_gans_two_optimizers.ipynb", "GANs and two optimizers",
           "two models, two optimizers, one window: what each step must see", 20, (2,)),
    Lesson(7, "07_verify_your_loop.ipynb", "Verify your own loop",
           "accumlib.verify: run your loop, read its verdict, name its bug", 20, (2, 3)),
    Lesson(8, "08_distributed.ipynb", "Distributed accumulation",
           "DDP's no_sync, communication per step, global token counts across ranks", 25, (3,)),
    Lesson(9, "09_real_bugs.ipynb", "Real bugs in real libraries",
           "Accelerate, Lightning and Transformers' Trainer under verify", 25, (3, 7)),
)

ROUTES: dict[str, tuple[int, ...]] = {
    "90-minute workshop": (1, 2, 3, 7),
    "half day (about 3.5 hours with breaks)": (1, 2, 3, 4, 5, 6, 7, 9),
}


def by_number(number: int) -> Lesson:
    for lesson in COURSE:
        if lesson.number == number:
            return lesson
    raise ValueError(f"number must be a lesson number between 1 and {len(COURSE)} (got {number!r})")


def title_of(path: Path) -> str:
    """A notebook's title: its first markdown heading without the "N · " prefix."""
    cells = json.loads(Path(path).read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].split(" · ", 1)[-1].strip()
    raise ValueError(f"path must be a notebook with a '# ' title (got {path} without one)")


def link(lesson: Lesson) -> str:
    return f"[{lesson.number} · {lesson.title}]({lesson.file})"


def table() -> Table:
    """The course as a table: lesson, what it teaches, minutes, prerequisites."""
    rows = [(f"{lesson.number}", lesson.title, lesson.teaches, f"{lesson.minutes} min",
             ", ".join(map(str, lesson.requires)) or "PyTorch basics")
            for lesson in COURSE]
    return Table(("#", "lesson", "you learn", "time", "needs lessons"), rows)


def routes() -> Table:
    rows = [(name, " → ".join(map(str, numbers)), f"{sum(by_number(n).minutes for n in numbers)} min")
            for name, numbers in ROUTES.items()]
    return Table(("route", "lessons", "lesson time"), rows)
