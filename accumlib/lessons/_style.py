"""One look for every figure of the lessons and the report: colour-blind safe, readable, thread-safe.

- Colours are the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"), which
  stays distinct under the common colour-vision deficiencies; each role also has its own
  marker and line style, so no contrast rests on colour alone (and grey-scale prints work).
- Text is 10 pt or larger.
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
from collections.abc import Callable
from typing import Any

import matplotlib
from matplotlib.figure import Figure

# Okabe-Ito, in their published order (black first)
BLACK, ORANGE, SKY_BLUE, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
)
PALETTE = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY_BLUE, BLACK)  # yellow is too light for lines on white
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)))

# What each kind of curve means across all lessons: the same role looks the same everywhere.
ROLE: dict[str, dict[str, Any]] = {
    "correct": dict(color=BLUE, marker="o", linestyle="-"),        # a correctly normalized loop
    "buggy": dict(color=VERMILLION, marker="s", linestyle="--"),    # a loop with a known bug
    "oracle": dict(color=BLACK, marker="", linestyle=":"),          # the true large-batch value
    "alternative": dict(color=GREEN, marker="^", linestyle="-."),   # a second correct variant
    "other": dict(color=ORANGE, marker="D", linestyle=(0, (3, 1, 1, 1))),
}
# Bars and areas: colour plus hatching.
HATCH = {"correct": "", "buggy": "//", "alternative": "..", "other": "xx"}

RC: dict[str, Any] = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 12,
    "axes.prop_cycle": matplotlib.cycler(color=list(PALETTE), marker=list(MARKERS)),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.markersize": 6,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    # plain tick labels, not mathtext: no shared parser state is needed to draw an axis
    "axes.formatter.use_mathtext": False,
}
MIN_FONT_PT = 10

_RENDER_LOCK = threading.RLock()


def figure(ncols: int = 1, nrows: int = 1, *, width: float | None = None, height: float = 4.0,
           title: str | None = None, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A styled Figure (constrained layout, no pyplot) and its axes, like ``plt.subplots``."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width or 5.5 * ncols, height), layout="constrained")
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
            return fn(*args, **kwargs)

    return wrapper


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, drawn under the one render lock."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with _RENDER_LOCK:
        FigureCanvasAgg(fig)  # attaches a canvas to a pyplot-free Figure
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()


def show(fig: Figure, alt: str | None = None) -> None:
    """Display a figure in the current output (a widget's Output area included), rendered under the lock.

    The figure is never registered with pyplot, so the inline backend does not show it a
    second time at the end of the cell.
    """
    from IPython.display import HTML, Image, display

    data = png(fig)
    if alt is None:
        display(Image(data))
    else:
        import base64
        import html

        display(HTML(f'<img src="data:image/png;base64,{base64.b64encode(data).decode()}" alt="{html.escape(alt)}">'))


def output(obj: Any, alt: str | None = None) -> dict[str, Any]:
    """One Jupyter ``display_data`` output for a figure (PNG, with alt text) or any displayable object."""
    import base64
    import html

    if isinstance(obj, Figure):
        src = base64.b64encode(png(obj)).decode()
        text = alt or (obj._suptitle.get_text() if obj._suptitle else "figure")
        data = {"image/png": src, "text/plain": f"<Figure: {text}>"}
        if alt:
            data["text/html"] = f'<img src="data:image/png;base64,{src}" alt="{html.escape(alt)}">'
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
