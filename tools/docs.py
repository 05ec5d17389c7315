"""`make docs`: the documentation site, built from the repository's own pages.

    python tools/docs.py [--out DIR]        (default build/docs: DIR/src staged, DIR/site built)

It stages, into DIR/src, the README (the home page), ``docs/*.md`` (the reference), the notebooks with
their committed outputs (never executed here) and the instructor's guide, each at its path in the
repository, so that every relative link works as the repository writes it; then every repository file
one of those pages links to (a survey table, a benchmark result, a repro script), and an API page whose
sections mkdocstrings renders from the docstrings. Notebooks link to their neighbours as ``NN_name.ipynb``
(what JupyterLab opens); in the site that is a page, ``NN_name.html``, so their markdown cells' links are
rewritten to the pages (the .ipynb itself is downloadable beside each page), and a widget, which needs a
kernel, says where it runs. Then ``mkdocs build --strict``
with ``mkdocs.yml``: a link to a missing page or heading fails the build. Run it with the docs venv's
Python (``make docs`` creates ``.venv-docs`` from ``docs/requirements.txt``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the API page shows: the public surface, then the public submodules a user calls into
API = [
    "accumlib",
    "accumlib.tasks",
    "accumlib.data",
    "accumlib.models",
    "accumlib.oracle",
    "accumlib.compare",
    "accumlib.harness",
    "accumlib.reference",
    "accumlib_course.memory",
    "accumlib.checks",
    "accumlib.text",
    "accumlib.batches",
    "accumlib.observe",
    "accumlib.hf",
    "accumlib.lightning",
]
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def _links(text: str) -> list[str]:
    """Relative link targets of a markdown text (code blocks and web addresses aside)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [m.group(2) for m in LINK.finditer(text) if not re.match(r"[a-z]+:", m.group(2))]


def _notebook_markdown(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def _as_page(target: str) -> str:
    """A notebook's link as the site has it: NN_name.ipynb -> NN_name.html, README.md -> index.html."""
    if target.endswith("README.md"):
        return target[: -len("README.md")] + "index.html"
    return re.sub(r"\.(ipynb|md)$", ".html", target)


WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = (
    "[an interactive widget: in JupyterLab (make lab) or on Binder its controls recompute the figure]"
)


def _static_widgets(nb: dict) -> None:
    """A widget needs a kernel: on a static page it says where it runs. Its saved state goes too, so that
    nbconvert does not load the widgets' JavaScript from unpkg.com (the site requests no other host)."""
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if WIDGET in out.get("data", {}):
                out["data"] = {"text/plain": WIDGET_NOTE}


def stage(src: Path) -> list[str]:
    """The site's sources in ``src``; returns the repository paths staged."""
    if src.exists():
        shutil.rmtree(src)
    pages = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
    pages += sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    pages += ["notebooks/INSTRUCTORS.md", "docs/site/extra.css"]
    staged, todo = set(), list(pages)
    while todo:  # the pages, then what they link to, transitively for markdown
        rel = todo.pop()
        if rel in staged:
            continue
        staged.add(rel)
        path = ROOT / rel
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".ipynb":
            nb = json.loads(path.read_text())
            targets = _links(_notebook_markdown(nb))
            _static_widgets(nb)
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    text = "".join(cell["source"])
                    text = LINK.sub(
                        lambda m: (
                            m.group(0)
                            if re.match(r"[a-z]+:", m.group(2))
                            else f"{m.group(1)}{_as_page(m.group(2))}{m.group(3) or ''}{m.group(4)}"
                        ),
                        text,
                    )
                    cell["source"] = text
            (src / rel).write_text(json.dumps(nb))
        else:
            shutil.copyfile(path, src / rel)
            targets = _links(path.read_text()) if path.suffix == ".md" else []
        for target in targets:
            linked = (path.parent / target).resolve()
            if linked.is_file() and ROOT in linked.parents:
                todo.append(linked.relative_to(ROOT).as_posix())
            elif (
                linked.is_dir() and ROOT in linked.parents
            ):  # a folder (notebooks/solutions/): a page listing it
                folder = linked.relative_to(ROOT).as_posix()
                files = sorted(p.name for p in linked.iterdir() if p.is_file() and not p.name.startswith("."))
                todo += [f"{folder}/{name}" for name in files]
                (src / folder).mkdir(parents=True, exist_ok=True)
                listing = "\n".join(f"- [`{name}`]({name})" for name in files)
                (src / folder / "index.md").write_text(f"# {folder}/\n\n{listing}\n")
    api = ["# API reference", "", "The public surface of the core, from the docstrings.", ""]
    api += [f"::: {name}\n" for name in API]
    (src / "api.md").write_text("\n".join(api))
    return sorted(staged)


def build(out: Path) -> Path:
    """Stage into ``out/src``, build into ``out/site`` (strict); returns the site's folder."""
    src, site = out / "src", out / "site"
    stage(src)
    config = (ROOT / "mkdocs.yml").read_text().replace("SOURCE_ROOT", str(ROOT))
    config += f"\ndocs_dir: {src}\nsite_dir: {site}\n"
    (out / "mkdocs.yml").write_text(config)
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(out / "mkdocs.yml")],
        capture_output=True,
        text=True,
        cwd=out,  # mkdocs-jupyter keeps its conversion cache in ./.cache: out here, not in the checkout
    )
    if run.returncode != 0:
        raise SystemExit(f"mkdocs build --strict failed:\n{run.stdout}{run.stderr}")
    for page in (site / "notebooks").glob("*.html"):
        page.write_text(mend_notebook_toc(page.read_text()))
    return site


def _slug(text: str) -> str:
    """Python-Markdown's (and mkdocs-jupyter's) slugify: ASCII, word characters, lower case, hyphens."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def mend_notebook_toc(html: str) -> str:
    """Point a notebook page's table of contents at its headings' ids.

    mkdocs-jupyter 0.26.3 gives a heading two anchors: the page's heading ``id`` comes from nbconvert's
    renderer (``convert.add_anchor_lower_id``: the heading's text, inline code included), the table of
    contents from Python-Markdown's toc extension run on ``nb2md`` output (``plugin._get_markdown_toc``),
    which drops inline code from the slug. A heading such as ``## 4. Skipped steps: an `inf` in the
    gradient`` gets ``id="4-skipped-steps-an-inf-in-the-gradient"`` and a contents link to
    ``#4-skipped-steps-an-in-the-gradient``: a dead link in the sidebar (tests/test_docs_site.py found it).
    Each contents link whose target is missing is pointed at the heading whose text, less its code, has
    that slug.
    """
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    moved = {}
    for hid, inner in re.findall(r'<h[1-6][^>]*\bid="([^"]+)"[^>]*>(.*?)</h[1-6]>', html, flags=re.S):
        without_code = re.sub(r"<[^>]+>", "", re.sub(r"<code>.*?</code>", "", inner, flags=re.S))
        key = _slug(without_code.replace("¶", ""))
        if key != hid and key not in ids:
            moved[key] = hid
    return re.sub(r'href="#([^"]+)"', lambda m: f'href="#{moved.get(m.group(1), m.group(1))}"', html)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "docs", help="default build/docs")
    args = parser.parse_args(argv)
    site = build(args.out.resolve())
    print(f"the site: {site / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
