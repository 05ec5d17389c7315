"""A widget that re-runs one lesson computation: controls in, ``compute(**values)``, ``show(result)`` out.

Used by the lessons of notebooks 4-7. ``Explorer.result`` holds the latest result, so a
test can set a control's ``value`` and assert on the recomputed result without a browser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .. import _style


class Explorer:
    """Controls + an output area; every change of a control re-runs ``compute`` and shows it.

    >>> import ipywidgets as w
    >>> ex = Explorer(lambda k: k * 2, str, k=w.IntSlider(value=2))
    >>> ex.result, (setattr(ex.controls["k"], "value", 5), ex.result)[1]
    (4, 10)
    """

    def __init__(
        self, compute: Callable[..., Any], show: Callable[[Any], Any], *, initial: Any = None, **controls: Any
    ):
        import ipywidgets as widgets

        self.compute, self.show, self.controls = compute, show, controls
        self.out = widgets.Output()
        self.widget = widgets.VBox([*controls.values(), self.out])
        self.result: Any = None
        self.error: Exception | None = None
        for control in controls.values():
            control.observe(self._rerun, names="value")
        # ``initial``: the result the notebook already computed for the controls' start values
        self._rerun(result=initial)

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def _rerun(self, change: Any = None, result: Any = None) -> None:
        # Runs in a widget callback, which JupyterLab 4.6 delivers on a kernel subshell thread:
        # the output area is filled by setting its outputs (see _style.show_in), never with
        # ``with self.out:`` or pyplot.
        if result is None and in_kernel():
            try:
                result = self.compute(**self.values())
            except Exception as e:  # a callback's error would only reach the server log: show it here
                _style.show_in(self.out, f"{type(e).__name__}: {e}")
                self.error = e
                return
        self.error = None
        self.result = result if result is not None else self.compute(**self.values())
        shown = self.show(self.result)
        if not in_kernel():
            if isinstance(shown, Figure):
                plt.close(shown)  # a pyplot figure (pyplot-free ones are simply dropped)
            return  # no frontend (pytest): the result is what a test checks
        _style.show_in(self.out, shown)
        if isinstance(shown, Figure):
            plt.close(shown)  # a pyplot figure must not be shown again by the inline backend

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None
