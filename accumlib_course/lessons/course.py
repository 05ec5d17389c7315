"""The course map: every lesson with what it teaches, its time, its prerequisites, and two routes.

``notebooks/00_start_here.ipynb`` shows ``table()`` and the routes; ``tests/test_course.py``
checks that this list, the notebooks' titles and their "Next" links agree. To add a lesson:
add its notebook, its ``accumlib_course/lessons/<lesson>.py``, and one ``Lesson`` here.

Times are planned workshop minutes for a lesson's core path (its cells not tagged ``optional``:
reading, running, the widget, the exercise and the questions). ``minimum_minutes`` states the rule
the planned time must meet, from the notebook itself: a reading rate per cell of each kind, plus the
runtime its last top-to-bottom execution recorded; ``tests/test_course.py`` holds every lesson to it.
A route's time is the reading rule of ``_route_time`` (words at 120 a minute plus the same allowances
per code cell, widget, exercise and question) over the sections it lists: ``route_time``, ``route``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from accumlib.checks import check_choice, check_int
from accumlib.text import Table

from ._route_time import (  # noqa: F401 (the rules, re-exported: course.minimum_minutes, course.MINUTES_PER)
    MINUTES_PER,
    SKIM_MINUTES,
    WIDGET_CALL,
    WORDS_PER_MINUTE,
    Section,
    cell_counts,
    minimum_minutes,
    notebooks_dir,
    sections,
)


@dataclass(frozen=True)
class Lesson:
    number: int
    file: str
    title: str
    teaches: str
    minutes: int
    requires: tuple[int, ...] = ()

    @property
    def module(self) -> str:
        """The lesson's module in ``accumlib_course.lessons``, named after its notebook, NN_<module>.ipynb."""
        return self.file.removesuffix(".ipynb").split("_", 1)[1]


COURSE: tuple[Lesson, ...] = (
    Lesson(
        1,
        "01_why_accumulate.ipynb",
        "Why accumulate gradients?",
        "memory per micro-batch; k micro-batches give the large batch's gradient",
        20,
    ),
    Lesson(
        2,
        "02_normalizing_the_loss.ipynb",
        "Normalizing the loss",
        "the naive sum is k times too large; three correct ways to divide",
        20,
        (1,),
    ),
    Lesson(
        3,
        "03_ragged_windows_and_tokens.ipynb",
        "Ragged windows and token counts",
        "the short last window; micro-batches with different token counts",
        20,
        (2,),
    ),
    Lesson(
        4,
        "04_mixed_precision.ipynb",
        "Mixed precision: GradScaler inside an accumulation window",
        "scale, unscale_, clip, step, update: where each goes in a window",
        25,
        (2,),
    ),
    Lesson(
        5,
        "05_batchnorm_vs_groupnorm.ipynb",
        "BatchNorm vs GroupNorm under accumulation",
        "why BatchNorm's statistics per micro-batch break exactness, and what GroupNorm changes",
        25,
        (2,),
    ),
    Lesson(
        6,
        "06_gans_two_optimizers.ipynb",
        "GANs and two optimizers",
        "two models, two optimizers, one window: what each step must see",
        20,
        (2,),
    ),
    Lesson(
        7,
        "07_verify_your_loop.ipynb",
        "Verify your own loop",
        "accumlib.verify: run your loop, read its verdict, name its bug",
        25,
        (2, 3),
    ),
    Lesson(
        8,
        "08_distributed.ipynb",
        "Distributed accumulation",
        "DDP's no_sync, communication per step, global token counts across ranks",
        25,
        (3,),
    ),
    Lesson(
        9,
        "09_real_bugs.ipynb",
        "Real bugs in real libraries",
        "Accelerate, Lightning and Transformers' Trainer under verify",
        30,
        (3, 7),
    ),
    Lesson(
        10,
        "10_your_own_project.ipynb",
        "Accumulation in your own project",
        "what to write: one loop to copy, the settings of Trainer, Accelerate, Lightning, TRL, PEFT, DDP",
        30,
        (2, 3),
    ),
)

# Each route: the sections it uses, lesson by lesson (None: every section of the lesson's core path; a
# section is a '#' or '##' heading of the notebook, 0 the lesson's opening), the sections it only skims
# (SKIM_MINUTES each), and the minutes the session lasts. A route's time is computed by the reading rule
# (accumlib_course/lessons/_route_time.py, route_time); what it leaves is slack, for setting up, a break and
# questions: at least SLACK_MIN_FRACTION of every route.
ROUTE_PLANS: dict[str, tuple[int, tuple[tuple[int, tuple[int, ...] | None], ...], frozenset]] = {
    # lesson 10 on the 90-minute route: its opening skimmed (run its set-up cell), then "The loop to copy"
    "90-minute workshop": (90, ((1, None), (2, None), (3, None), (10, (0, 1))), frozenset({(10, 0)})),
    # lesson 9's TRL and PEFT section is skimmed: it is for learners who use those libraries; lesson 10
    # leaves out §3 (each framework's settings: lesson 9, on this route, runs those libraries) and §5
    # (checkpointing against accumulation, an aside), so that §2's small GPT fits
    "half day (4 hours with breaks)": (
        240,
        (*((n, None) for n in (1, 2, 3, 4, 7, 8, 9)), (10, (0, 1, 2, 4, 6, 7, 8, 9, 10))),
        frozenset({(9, 5)}),
    ),
}
ROUTES: dict[str, tuple[int, ...]] = {
    name: tuple(n for n, _ in plan[1]) for name, plan in ROUTE_PLANS.items()
}
ROUTE_MINUTES: dict[str, int] = {name: plan[0] for name, plan in ROUTE_PLANS.items()}
SLACK_MIN_FRACTION = 1 / 6  # 15 of 90 minutes: setting up, one break, questions


@dataclass(frozen=True)
class Reference:
    """A source the course cites: its title, its own address (``None`` where the course could not establish
    one: then ``by`` names its author and venue), what the course takes from it, and the lessons citing it."""

    title: str
    url: str | None
    where: str
    lessons: tuple[int, ...]
    by: str = ""

    def link(self) -> str:
        """The title linked to the source's address; without one, the title in italics and who published it
        where (never a search-engine query in its place).

        >>> Reference("A post", None, "what it is", (2,), by="blog post, author not recorded").link()
        '*A post* (blog post, author not recorded)'
        """
        return f"[{self.title}]({self.url})" if self.url else f"*{self.title}* ({self.by})"


# Every source the lessons cite, by title, linked to its own address. Four have no address the course
# could establish (the Stack Overflow question, the GAN article on GitHub, two blog posts: the copies the
# course worked from carry none): they are cited by title, author and venue, without a link, rather than
# linked to a search for their words (tests/test_course.py refuses a search query as a cited link).
REFERENCES: dict[str, Reference] = {
    "stackoverflow": Reference(
        "Stack Overflow: gradient accumulation with GradScaler when the last window is short",
        None,
        "110 samples, micro-batch 8, k = 4; the copy the course worked from lacks the question's own title "
        "and address, so the title here says what it asks and no link is given",
        (3, 7),
        by="question by andrea, accepted answer by Shai, January 2021",
    ),
    "mindspore": Reference(
        "Gradient Accumulation Algorithm",
        "https://www.mindspore.cn/docs/en/r2.4.10/model_train/train_process/optimize/gradient_accumulation.html",
        "MindSpore tutorial: batch 64 against 2 x 32 accumulated on MNIST; its Accumulator class; 'amplify "
        "the learning rate'",
        (1, 5),
    ),
    "huggingface": Reference(
        "Fixing Gradient Accumulation",
        "https://huggingface.co/blog/gradient_accumulation",
        "Hugging Face blog post (October 2024): the Trainer's mean of per-micro-batch means, fixed with "
        "num_items_in_batch",
        (3, 9, 10),
    ),
    "unsloth": Reference(
        "Bugs in LLM Training - Gradient Accumulation Fix",
        "https://unsloth.ai/blog/gradient",
        "Unsloth blog post (October 2024): accumulated and full-batch losses differ when sequences differ "
        "in length",
        (3, 9, 10),
    ),
    "pytorch-amp": Reference(
        "Automatic Mixed Precision examples: gradient accumulation",
        "https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation",
        "PyTorch notes: scale every micro-batch, unscale_ once, then clip, step and update once per window",
        (3, 4, 7),
    ),
    "gan-article": Reference(
        "Gradient Accumulation in PyTorch, GANs and other Nightmares",
        None,
        "loss / n or .grad / n; two optimizers and the generator's leak into D",
        (2, 6),
        by="article on GitHub, author and address not recorded",
    ),
    "bert-post": Reference(
        "How Gradient accumulation is implemented",
        None,
        "a BERT project's train_one_epoch with loss / n_accumulate and a tqdm running loss",
        (2,),
        by="blog post, author and address not recorded",
    ),
    "explained": Reference(
        "【ML】Gradient Accumulation explained",
        None,
        "an extra optimizer step for the last batch",
        (3,),
        by="blog post, author and address not recorded",
    ),
    # the libraries' own documentation of the settings lesson 10 tells you to write
    "accelerate-docs": Reference(
        "Performing gradient accumulation",
        "https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation",
        "Accelerate's guide: accelerator.accumulate() and counting a window's tokens yourself",
        (10,),
    ),
    "lightning-docs": Reference(
        "Trainer: accumulate_grad_batches",
        "https://lightning.ai/docs/pytorch/stable/common/trainer.html#accumulate-grad-batches",
        "Lightning's Trainer flag that accumulates k batches per optimizer step",
        (10,),
    ),
    "ddp-no-sync": Reference(
        "DistributedDataParallel.no_sync",
        "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync",
        "PyTorch reference: skip DDP's all-reduce inside a window",
        (8, 10),
    ),
    "fsdp2": Reference(
        "torch.distributed.fsdp.fully_shard",
        "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html",
        "PyTorch reference: FSDP2's FSDPModule.set_requires_gradient_sync",
        (10,),
    ),
    "checkpoint": Reference(
        "torch.utils.checkpoint",
        "https://pytorch.org/docs/stable/checkpoint.html",
        "PyTorch reference: gradient (activation) checkpointing",
        (10,),
    ),
}


def cite(key: str) -> str:
    """A source as the lessons cite it: its title, linked.

    >>> cite("huggingface")
    '[Fixing Gradient Accumulation](https://huggingface.co/blog/gradient_accumulation)'
    """
    check_choice("key", key, sorted(REFERENCES))
    return REFERENCES[key].link()


def references() -> Table:
    """Every cited source: title with its address, what it is, the lessons that use it."""
    rows = [
        (ref.title, ref.url or f"none: {ref.by}", ref.where, ", ".join(map(str, ref.lessons)))
        for ref in REFERENCES.values()
    ]
    return Table(("source", "address", "what it is", "lessons"), rows)


def by_number(number: int) -> Lesson:
    check_int("number", number, low=1, high=len(COURSE), why="a lesson number")
    (lesson,) = [lesson for lesson in COURSE if lesson.number == number]
    return lesson


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
    rows = [
        (
            f"{lesson.number}",
            lesson.title,
            lesson.teaches,
            f"{lesson.minutes} min",
            ", ".join(map(str, lesson.requires)) or "PyTorch basics",
        )
        for lesson in COURSE
    ]
    return Table(("#", "lesson", "you learn", "time", "needs lessons"), rows)


def route_sections(route: str) -> list[tuple[Section, bool, float]]:
    """Every section a route uses, in order: the section, whether it is only skimmed, its minutes by the
    reading rule (``_route_time``: words at WORDS_PER_MINUTE plus the allowances per cell)."""
    check_choice("route", route, sorted(ROUTES))
    _, plan, skimmed = ROUTE_PLANS[route]
    used = []
    for number, wanted in plan:
        for section in sections(notebooks_dir() / by_number(number).file):
            if wanted is None or section.index in wanted:
                skim = (number, section.index) in skimmed
                used.append((section, skim, SKIM_MINUTES if skim else section.minutes))
    return used


def route_time(route: str) -> int:
    """A route's minutes by the reading rule: its sections' minutes, summed and rounded up."""
    return math.ceil(sum(minutes for _, _, minutes in route_sections(route)) - 1e-9)


def slack(route: str) -> int:
    """Minutes of a route that its sections leave free (set-up, breaks, questions), by the reading rule.

    >>> slack("90-minute workshop") >= 15
    True
    """
    check_choice("route", route, sorted(ROUTES))
    return ROUTE_MINUTES[route] - route_time(route)


def routes() -> Table:
    """Every route: its lessons, their time by the reading rule, the session's length and the slack left."""
    rows = [
        (name, " → ".join(map(str, numbers)), f"{route_time(name)} min", f"{ROUTE_MINUTES[name]} min")
        + (f"{slack(name)} min",)
        for name, numbers in ROUTES.items()
    ]
    return Table(
        ("route", "lessons", "time by the rule", "session", "slack (set-up, breaks, questions)"), rows
    )


def route(name: str) -> Table:
    """One route, lesson by lesson: the sections it uses (§0 the lesson's opening; 'skim' those it only
    skims), their words and their minutes by the reading rule."""
    rows = []
    for number in ROUTES[name] if name in ROUTES else check_choice("route", name, sorted(ROUTES)):
        used = [(s, skim, m) for s, skim, m in route_sections(name) if s.file == by_number(number).file]
        listed = ", ".join(f"§{s.index}" + (" (skim)" if skim else "") for s, skim, _ in used)
        words = sum(s.counts.words for s, skim, _ in used if not skim)
        rows.append((f"{number}", listed, f"{words}", f"{sum(m for *_, m in used):.1f} min"))
    rows.append(("all", "", "", f"{route_time(name)} min of {ROUTE_MINUTES[name]}: {slack(name)} min slack"))
    caption = (
        f"{name}: {WORDS_PER_MINUTE} words a minute, plus the allowances per code cell, widget, exercise"
    )
    return Table(("lesson", "sections", "words read", "minutes"), rows, caption + " and question")
