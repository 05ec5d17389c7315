"""The documentation site (``make docs``), built as a reader gets it and opened in Chromium: every page
loads, every link inside the site opens a page that exists (at a heading that exists), and every figure
shows, with its alt text. The build is ``mkdocs build --strict``: a markdown link to a missing page or
heading already fails there; this test checks what the built pages do, notebook pages included (their
links are HTML that MkDocs does not check).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from _jupyter import chromium_missing_reason, chromium_page

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    run = subprocess.run(
        ["make", "docs", f"DOCS_OUT={out}"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=900
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return out / "site"


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(v for k, v in attrs if k in ("id", "name") and v)


@functools.cache
def _ids(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(errors="replace"))
    return frozenset(parser.ids)


def site_target(site: Path, page: Path, href: str) -> tuple[Path, str] | None:
    """The file (and fragment) a relative link of ``page`` opens in the site; None for other sites."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if path.is_dir():
        path = path / "index.html"
    return path, parts.fragment


def broken(site: Path, page: Path, hrefs: list[str]) -> list[str]:
    bad = []
    for href in hrefs:
        target = site_target(site, page, href)
        if target is None:
            continue
        path, fragment = target
        if site not in path.parents and path != site:
            bad.append(f"{href}: outside the site")
        elif not path.is_file():
            bad.append(f"{href}: no such page")
        elif fragment and path.suffix == ".html" and unquote(fragment) not in _ids(path):
            bad.append(f"{href}: no such heading")
    return bad


def test_the_link_check_sees_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "a.html").write_text('<h2 id="here">Here</h2>')
    page = tmp_path / "b.html"
    page.write_text('<a href="#">top</a>')
    hrefs = ["a.html#here", "a.html#there", "c.html", "https://example.org/", "#", "../x.html"]
    assert broken(tmp_path, page, hrefs) == [
        "a.html#there: no such heading",
        "c.html: no such page",
        "../x.html: outside the site",
    ]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # a line per request would bury the test's own output
        pass


def committed_figures() -> int:
    """The figures (PNG images) in the notebooks' committed outputs."""
    count = 0
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                html = data.get("text/html", "")
                html = "".join(html) if isinstance(html, list) else html
                count += html.count('<img src="data:image/png') or int("image/png" in data)
    return count


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_every_page_loads_links_resolve_and_figures_show_with_alt_text(site, tmp_path):
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    names = {p.relative_to(site).as_posix() for p in pages}
    # the three doors, the reference, every notebook and the API page are pages of the site
    expected = {"index.html", "api.html", "docs/run.html", "docs/verify.html", "notebooks/report.html"}
    expected |= {f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert expected <= names, sorted(expected - names)
    server, base = _serve(site)
    problems: dict[str, list[str]] = {}
    figures = 0
    try:
        with chromium_page(tmp_path / "profile") as page:
            for path in pages:
                rel = path.relative_to(site).as_posix()
                response = page.goto(f"{base}/{rel}", wait_until="load")
                found = [] if response and response.ok else [f"HTTP {response and response.status}"]
                hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
                found += broken(site, path, hrefs)
                images = page.eval_on_selector_all(
                    "img",
                    "els => els.map(e => ({alt: e.getAttribute('alt') || '', w: e.naturalWidth, "
                    "src: (e.getAttribute('src') || '').slice(0, 60)}))",
                )
                for img in images:
                    if not img["alt"].strip():
                        found.append(f"an image without alt text: {img['src']}")
                    if img["w"] == 0:
                        found.append(f"an image that does not show: {img['src']}")
                figures += sum(img["src"].startswith("data:image/png") for img in images)
                if found:
                    problems[rel] = found
            external = sorted({urlsplit(u).netloc for u in page.external_requests})
    finally:
        server.shutdown()
    assert problems == {}, "\n".join(f"{k}: {v}" for k, v in problems.items())
    assert figures == committed_figures() > 0  # every figure the notebooks were committed with is in the site
    assert external == [], f"the site requests other hosts: {external}"


def test_the_tests_cell_tags_are_not_shown_to_readers(tmp_path, site):
    reason = chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    server, base = _serve(site)
    try:
        with chromium_page(tmp_path / "profile") as page:
            page.goto(f"{base}/notebooks/03_ragged_windows_and_tokens.html", wait_until="load")
            tags = page.locator(".tags_button_container")
            assert tags.count() > 0  # the page has tagged cells: the check below has something to hide
            assert not any(tags.nth(i).is_visible() for i in range(tags.count()))
    finally:
        server.shutdown()


def test_a_widget_says_where_it_runs(site):
    page = (site / "notebooks" / "03_ragged_windows_and_tokens.html").read_text()
    assert "an interactive widget: in JupyterLab (make lab) or on Binder" in page


def test_the_api_page_is_rendered_from_the_docstrings(site):
    api = (site / "api.html").read_text()
    for name in ("accumlib.verify", "accumlib.true_gradient", "accumlib.checks.check_int"):
        assert name in api, name
    # a doctest renders as code, not as prose in which x[0][0] reads as a link
    assert re.search(r"<code>.*?&gt;&gt;&gt;", api, re.S)
