"""One look for every figure of the lessons and the report: colour-blind safe, readable, thread-safe.

- Colours are the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"), which
  stays distinct under the common colour-vision deficiencies; each role also has its own
  marker and line style, so no contrast rests on colour alone (and grey-scale prints work).
- Text is 14 pt or larger at the size the figure is shown: a figure is at most ``MAX_WIDTH_IN``
  inches wide at ``figure.dpi`` (a wider request keeps its height), so JupyterLab shows it at
  its own size on a 1024-pixel projector, and long titles are wrapped to the figure's width.
- Every figure carries alt text built from its numbers (``describe``): titles, axis labels, each
  curve's or bar's values. ``show``, ``output`` and the figure's own display in a notebook cell
  (an HTML ``<img alt=...>`` beside the PNG) all use it when no alt text is given.
- ``figure(...)`` builds a ``matplotlib.figure.Figure`` without pyplot: no global figure
  manager is touched, so a widget callback cannot collide with the inline backend's own
  drawing. ``png(fig)`` renders under one lock, because matplotlib's mathtext parser
  is a process-wide object that breaks when two threads lay out text at once
  (``IndexError: pop from empty list`` in ``_mathtext.Parser.pop_state``).

>>> fig, ax = figure(title="t")
>>> ax.plot([0, 1], [0, 1], **ROLE["correct"])[0].get_marker()
'o'
>>> png(fig)[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
True
"""

from __future__ import annotations

import io
import threading
import weakref
from collections.abc import Callable
from typing import Any

import matplotlib
from matplotlib.figure import Figure

# Okabe-Ito, in their published order (black first)
BLACK, ORANGE, SKY_BLUE, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000",
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
)
PALETTE = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY_BLUE, BLACK)  # yellow is too light for lines on white
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)))

# What each kind of curve means across all lessons: the same role looks the same everywhere.
ROLE: dict[str, dict[str, Any]] = {
    "correct": dict(color=BLUE, marker="o", linestyle="-"),  # a correctly normalized loop
    "buggy": dict(color=VERMILLION, marker="s", linestyle="--"),  # a loop with a known bug
    "oracle": dict(color=BLACK, marker="", linestyle=":"),  # the true large-batch value
    "alternative": dict(color=GREEN, marker="^", linestyle="-."),  # a second correct variant
    "other": dict(color=ORANGE, marker="D", linestyle=(0, (3, 1, 1, 1))),
}
# Bars and areas: colour plus hatching.
HATCH = {"correct": "", "buggy": "//", "alternative": "..", "other": "xx"}

RC: dict[str, Any] = {
    "font.size": 14,
    "axes.titlesize": 15,
    "axes.labelsize": 14,
    "xtick.labelsize": 14,
    "ytick.labelsize": 14,
    "legend.fontsize": 14,
    "figure.titlesize": 16,
    "axes.prop_cycle": matplotlib.cycler(color=list(PALETTE), marker=list(MARKERS)),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.markersize": 6,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    # plain tick labels, not mathtext: no shared parser state is needed to draw an axis
    "axes.formatter.use_mathtext": False,
}
MIN_FONT_PT = 14
MAX_WIDTH_IN = 10.0  # 1000 pixels at figure.dpi: shown unscaled in JupyterLab on a 1024-wide projector

_RENDER_LOCK = threading.RLock()


def figure(
    ncols: int = 1,
    nrows: int = 1,
    *,
    width: float | None = None,
    height: float = 4.0,
    title: str | None = None,
    **subplot_kw: Any,
) -> tuple[Figure, Any]:
    """A styled Figure (constrained layout, no pyplot) and its axes, like ``plt.subplots``."""
    width = width or 5.5 * ncols
    if width > MAX_WIDTH_IN:  # narrower panels, same height: the text keeps its size and room
        width = MAX_WIDTH_IN
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=True, subplot_kw=subplot_kw or None)
        if title:
            fig.suptitle(title)
    return fig, axes


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Run a plot function with the lessons' rcParams, so every text and line it makes is styled."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with _RENDER_LOCK, matplotlib.rc_context(RC):
            fig = fn(*args, **kwargs)
            if isinstance(fig, Figure):
                readable(fig)
        _install_html_formatter()
        return fig

    return wrapper


def readable(fig: Figure) -> Figure:
    """Raise every text below MIN_FONT_PT to it, and wrap titles to the width they have."""
    import textwrap

    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)
    titles = [(fig._suptitle, 0.95 * fig.get_figwidth())] if fig._suptitle is not None else []
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is not None:  # the panel's share of the width, less room for its tick labels
            grid = spec.get_gridspec()
            columns = spec.colspan.stop - spec.colspan.start
            titles.append((ax.title, 0.85 * fig.get_figwidth() * columns / grid.ncols))
    for ax in fig.axes:  # axis labels wrap to their panel too
        spec = ax.get_subplotspec()
        if spec is not None and ax.xaxis.label.get_text():
            grid = spec.get_gridspec()
            share = (spec.colspan.stop - spec.colspan.start) / grid.ncols
            titles.append((ax.xaxis.label, 0.85 * fig.get_figwidth() * share))
    for text, inches in titles:
        chars = max(20, int(inches * 72 / (0.5 * text.get_fontsize())))  # ~0.5 em per character
        lines = text.get_text().splitlines()
        if any(len(line) > chars for line in lines):
            text.set_text("\n".join(textwrap.fill(line, chars) for line in lines))
    return fig


def _number(x: float) -> str:
    return f"{x:.3g}"


def _values(ys: Any, most: int = 8) -> str:
    import numpy as np

    ys = np.asarray(ys, dtype=float).ravel()
    ys = ys[np.isfinite(ys)]
    if ys.size == 0:
        return "no finite values"
    if ys.size <= most:
        return ", ".join(map(_number, ys))
    return (
        f"{ys.size} values from {_number(ys[0])} to {_number(ys[-1])}, "
        f"min {_number(ys.min())}, max {_number(ys.max())}"
    )


def describe(fig: Figure, *, limit: int = 1500) -> str:
    """Alt text for a figure, from what it plots: its titles, every axis's labels and range, and the
    values of each labelled curve, bar series and point set (numbers to three significant digits).

    >>> fig, ax = figure(title="error per step")
    >>> _ = ax.plot([1, 2, 3], [0.5, 0.25, 0.125], label="naive")
    >>> _ = ax.set_xlabel("step")
    >>> describe(fig)
    'Figure: error per step. Panel 1: x step; naive: 0.5, 0.25, 0.125.'
    """
    from matplotlib.container import BarContainer

    parts = []
    if fig._suptitle is not None and fig._suptitle.get_text().strip():
        parts.append(f"Figure: {' '.join(fig._suptitle.get_text().split())}.")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    for i, ax in enumerate(panels, 1):
        title = " ".join(ax.get_title().split())
        head = f"Panel {i}" + (f" ({title})" if title else "")
        axes = [
            f"{name} {label}"
            + (f" ({scale} scale)" if scale != "linear" and scale not in label.lower() else "")
            for name, label, scale in (
                ("x", ax.get_xlabel(), ax.get_xscale()),
                ("y", ax.get_ylabel(), ax.get_yscale()),
            )
            if label.strip()
        ]
        head += (": " + ", ".join(axes)) if axes else ""
        series = []
        for line in ax.get_lines():
            label = line.get_label()
            if line.get_visible() and not label.startswith("_"):
                series.append(f"{label}: {_values(line.get_ydata())}")
        for container in ax.containers:
            if isinstance(container, BarContainer):
                label = container.get_label()
                heights = [
                    bar.get_height() if not container.orientation == "horizontal" else bar.get_width()
                    for bar in container
                ]
                series.append(f"{'bars' if label.startswith('_') else label}: {_values(heights)}")
        for collection in ax.collections:
            label = collection.get_label()
            offsets = getattr(collection, "get_offsets", lambda: [])()
            if not label.startswith("_") and len(offsets):
                series.append(f"{label}: {_values([y for _, y in offsets])}")
        for text in ax.texts:
            if text.get_visible() and text.get_text().strip():
                series.append(f"note '{' '.join(text.get_text().split())}'")
        parts.append(head + ("; " + "; ".join(series) if series else "") + ".")
    alt = " ".join(parts) or "figure"
    return alt if len(alt) <= limit else alt[: limit - 1] + "…"


def _img(fig: Figure, alt: str | None) -> str:
    import base64
    import html

    src = base64.b64encode(png(fig)).decode()
    # the drawing is the figure as it is now (savefig's own restores only mark it stale): any change
    # from here on marks it stale again, and the PNG formatter draws it anew
    fig.stale = False
    _LAST_PNG[:] = [weakref.ref(fig), src]
    return f'<img src="data:image/png;base64,{src}" alt="{html.escape(alt or describe(fig))}">'


# The PNG the HTML formatter just drew, for the PNG formatter IPython calls right after it on the same
# figure (its formatters run in order: text/plain, text/html, ..., image/png): a figure a cell returns is
# drawn once, not once for each MIME type (each draw is a full constrained layout: about 1 s for a
# two-panel figure on 2 cores). Taken once, and only for the same figure, unchanged since.
_LAST_PNG: list[Any] = []


def _png_b64(fig: Figure) -> str:
    import base64

    last, _LAST_PNG[:] = list(_LAST_PNG), []
    if last and last[0]() is fig and not fig.stale:
        return last[1]
    return base64.b64encode(png(fig)).decode()


_FORMATTER_SHELLS: set[int] = set()


def _install_html_formatter() -> None:
    """Let IPython show a Figure returned by a cell as ``<img alt=...>``, and as PNG from the same drawing
    (in place of the inline backend's second one, which also draws outside the lessons' rcParams)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the lessons
        return
    ip = get_ipython()
    if ip is None or id(ip) in _FORMATTER_SHELLS:
        return
    ip.display_formatter.formatters["text/html"].for_type(Figure, lambda fig: _img(fig, None))
    ip.display_formatter.formatters["image/png"].for_type(Figure, _png_b64)
    _FORMATTER_SHELLS.add(id(ip))


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, drawn under the one render lock."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with _RENDER_LOCK, matplotlib.rc_context(RC):  # tick labels made while drawing get the style's sizes
        canvas = FigureCanvasAgg(fig)  # attaches a canvas to a pyplot-free Figure
        _fit_legends(fig, canvas)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.05)  # nothing clipped at the edges
        return buf.getvalue()


def _fit_legends(fig: Figure, canvas: Any) -> None:
    """Fewer legend columns while a legend is wider than the figure, or an axes legend than its panel's share
    of it (14 pt text in a 10-inch figure),
    and an x-axis label wider than its panel, as drawn, wrapped to it."""
    import textwrap

    # layout without rasterising: the extents are all this needs
    fig.draw_without_rendering()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        label = ax.xaxis.label
        width, room = label.get_window_extent(renderer).width, ax.get_window_extent(renderer).width
        if label.get_text() and "\n" not in label.get_text() and width > room > 0:
            label.set_text(
                textwrap.fill(label.get_text(), max(20, int(len(label.get_text()) * room / width)))
            )
    for ax in fig.axes:  # an axes legend fits its panel's share of the width (the layout makes room for it)
        legend, spec = ax.get_legend(), ax.get_subplotspec()
        if legend is None or spec is None:
            continue
        room = 0.9 * fig.bbox.width * (spec.colspan.stop - spec.colspan.start) / spec.get_gridspec().ncols
        while legend._ncols > 1 and legend.get_window_extent(renderer).width > room:
            legend = ax.legend(
                legend.legend_handles,
                [t.get_text() for t in legend.texts],
                loc=legend._loc,
                ncols=legend._ncols - 1,
                fontsize=max(MIN_FONT_PT, legend.texts[0].get_fontsize()),
            )
            fig.draw_without_rendering()
            renderer = canvas.get_renderer()
    for legend in fig.legends:
        while legend._ncols > 1 and legend.get_window_extent(renderer).width > fig.bbox.width:
            legend.set_ncols(legend._ncols - 1)  # set_ncols alone keeps the old box: rebuild it
            legend._init_legend_box(legend.legend_handles, [t.get_text() for t in legend.texts])
            fig.draw_without_rendering()
            renderer = canvas.get_renderer()


def show(fig: Figure, alt: str | None = None) -> None:
    """Display a figure in the current output (a widget's Output area included), rendered under the lock,
    with ``alt`` as its alt text (``describe(fig)`` when none is given).

    The figure is never registered with pyplot, so the inline backend does not show it a
    second time at the end of the cell.
    """
    from IPython.display import HTML, display

    display(HTML(_img(fig, alt)))


def output(obj: Any, alt: str | None = None) -> dict[str, Any]:
    """One Jupyter ``display_data`` output for a figure (PNG, and HTML with alt text: ``alt`` or
    ``describe(fig)``) or any displayable object."""
    import base64
    import html

    if isinstance(obj, Figure):
        src = base64.b64encode(png(obj)).decode()
        alt = alt or describe(obj)
        data = {
            "image/png": src,
            "text/plain": f"<Figure: {alt}>",
            "text/html": f'<img src="data:image/png;base64,{src}" alt="{html.escape(alt)}">',
        }
        return {"output_type": "display_data", "metadata": {}, "data": data}
    if isinstance(obj, str):
        return {"output_type": "stream", "name": "stdout", "text": obj if obj.endswith("\n") else obj + "\n"}
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:
        ip = None
    if ip is not None:  # every representation IPython knows (HTML tables, LaTeX, images ...)
        data, metadata = ip.display_formatter.format(obj)
        return {"output_type": "display_data", "metadata": metadata, "data": data}
    data = {"text/plain": str(obj)}
    if hasattr(obj, "_repr_html_"):
        data["text/html"] = obj._repr_html_()
    return {"output_type": "display_data", "metadata": {}, "data": data}


def show_in(out: Any, *objs: Any, alt: str | None = None) -> None:
    """Replace what an ``ipywidgets.Output`` shows with ``objs``, by setting its ``outputs``.

    Safe from a widget callback: JupyterLab 4.6 sends widget messages over a kernel subshell
    (``commsOverSubshells``), which ipykernel 7 runs in a thread of its own, beside the thread
    executing cells. ``with out:`` captures by the *main* thread's message context and
    ``plt.show`` draws every pyplot figure, the cell thread's included; setting ``outputs``
    with figures drawn under the render lock does neither.
    """
    out.outputs = tuple(output(o, alt=alt if isinstance(o, Figure) else None) for o in objs)


def font_sizes(fig: Figure) -> list[float]:
    """Every visible text's size in points (tests assert >= MIN_FONT_PT)."""
    from matplotlib.text import Text

    return [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
