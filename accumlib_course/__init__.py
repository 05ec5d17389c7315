"""The course beside the core: what the notebooks compute, in the repository next to ``notebooks/``.

- ``lessons``: one module per notebook (its widgets, figures and graders), ``lessons.course`` the map;
- ``gallery``: user-style training loops (the seeds', Stack Overflow's, frameworks'), each with the
  verdict verify must give it; lesson 7 shows them, the tests run every one;
- ``report``: the papermill report's computation and figures (``notebooks/report.ipynb``);
- ``_style``: the course's figure style (matplotlib without pyplot, alt text on every figure).

It needs the ``course`` extra (numpy, matplotlib, tqdm; ``notebooks`` adds Jupyter and the
frameworks) and imports only the public modules of ``accumlib``: ``tests/test_layers.py`` fails on
an import of a private core module from here, and on any import of this package from the core.
"""
