"""The computations behind each notebook, as pure functions:
``compute(...) -> result``, ``plot(result) -> Figure``.

One module per lesson. Notebooks call these once with defaults (so every headless run
shows a figure) and then offer a widget that re-runs the same function.
"""
