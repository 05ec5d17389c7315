"""``make report``: the report notebook run by papermill, then written by nbconvert as a page to read.

    python -m accumlib_course.report.render notebooks/report.ipynb reports \\
        -p task mlp-digits -p accum_steps "1 2 4 8"

writes, in the output folder, ``report.ipynb`` (the executed notebook), ``report.json`` (every number,
unless ``-p results_path`` says otherwise) and ``report.html``: the outputs only, with no code, no ``In []``
prompts and neither parameters cell (the notebook's defaults nor the values papermill injects), so the
parameters show once, as the report's own table of the values it ran with.

The kernel talks to papermill over the ipc transport (a local socket): over tcp, ipykernel warns on
every run that its traffic is unencrypted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

# nbconvert's HTML: outputs only; the parameters cells (papermill's tags) left out altogether
HTML_CONFIG: dict[str, dict[str, Any]] = {
    "TemplateExporter": {"exclude_input": True, "exclude_input_prompt": True, "exclude_output_prompt": True},
    "TagRemovePreprocessor": {"enabled": True, "remove_cell_tags": {"parameters", "injected-parameters"}},
}


def value(text: str) -> Any:
    """A ``-p`` value as papermill's command line reads it: an integer, a float, or else the string.

    >>> value("3"), value("-1"), value("2.5"), value("1 2 4 8"), value("cpu")
    (3, -1, 2.5, '1 2 4 8', 'cpu')
    """
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def render(notebook: str | os.PathLike[str], out_dir: str | os.PathLike[str], **parameters: Any) -> Path:
    """Run ``notebook`` with ``parameters`` into ``out_dir/report.ipynb`` and write ``out_dir/report.html``.

    ``results_path`` defaults to ``out_dir/report.json``. A cell that raises (a parameter refused by
    ``check_parameters``) raises ``papermill.PapermillExecutionError`` and writes no HTML.

    >>> render("no/such/notebook.ipynb", ".")
    Traceback (most recent call last):
    ...
    ValueError: notebook must be an existing .ipynb file (got 'no/such/notebook.ipynb')
    """
    if not os.path.isfile(notebook) or not os.fspath(notebook).endswith(".ipynb"):
        raise ValueError(f"notebook must be an existing .ipynb file (got {os.fspath(notebook)!r})")
    import papermill
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    executed, page = out / "report.ipynb", out / "report.html"
    page.unlink(missing_ok=True)  # a failed run leaves no page of an earlier one behind
    parameters.setdefault("results_path", str(out / "report.json"))
    os.environ.setdefault("MPLBACKEND", "Agg")  # the kernel inherits it: no display needed
    # a short path: a socket's name is limited to about 100 characters
    with tempfile.TemporaryDirectory() as sockets:
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
        papermill.execute_notebook(
            os.fspath(notebook),
            str(executed),
            parameters=parameters,
            progress_bar=False,
            config=ipc,
            kernel_manager_class=_quiet_shutdown_manager(),
        )
    body, _ = HTMLExporter(config=Config(HTML_CONFIG)).from_filename(str(executed))
    page.write_text(body, encoding="utf-8")
    return page


def _quiet_shutdown_manager() -> type:
    """nbclient's kernel manager, less the SIGINT jupyter_client 8 sends before its shutdown request.

    A kernel that is still handling a message when that SIGINT lands logs "[IPKernelApp] ERROR |
    KeyboardInterrupt caught in kernel." on stderr (ipykernel's kernelbase.py, dispatch_shell), which
    on a busy machine made some runs of a clean report print an error. The run is over by then: the
    shutdown request alone stops the kernel (and jupyter_client still terminates it if it does not).
    """
    from jupyter_client.manager import AsyncKernelManager

    class QuietShutdownKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return QuietShutdownKernelManager


def main(argv: list[str] | None = None) -> int:
    """The command line ``make report`` calls; exit status 1, with the notebook's error, when a cell
    raises."""
    parser = argparse.ArgumentParser(
        prog="python -m accumlib_course.report.render", description=__doc__.split("\n")[0]
    )
    parser.add_argument("notebook", help="the report notebook (notebooks/report.ipynb)")
    parser.add_argument("out_dir", help="the folder to write report.ipynb, report.html and report.json in")
    parser.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a parameter of the notebook's parameters cell, as for papermill",
    )
    args = parser.parse_args(argv)
    from papermill import PapermillExecutionError

    parameters = {name: value(v) for name, v in args.parameter}
    parameters.setdefault("results_path", str(Path(args.out_dir) / "report.json"))
    try:
        page = render(args.notebook, args.out_dir, **parameters)
    except PapermillExecutionError as e:
        executed = Path(args.out_dir) / "report.ipynb"
        print(
            f"report: the notebook raised {e.ename}: {e.evalue} (executed notebook: {executed})",
            file=sys.stderr,
        )
        return 1
    numbers = parameters["results_path"] or "no file"
    print(f"report: {page.parent / 'report.ipynb'}, {page} and every number in {numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
