"""The course on a projector: every committed lesson figure, as JupyterLab draws it in a 1024 x 768
window with its file browser open, keeps its smallest text at or above 11 px on screen (issue 30).

Its own file, so that pytest-xdist can run it beside test_browser.py's Run All of every lesson (one
JupyterLab each, from the same fixtures).
"""

from __future__ import annotations

import json

import pytest
import test_browser as tb
from _jupyter import notebook, open_notebook

lab, page = tb.lab, tb.page  # the fixtures, run here by this module's own JupyterLab

PROJECTOR = {"width": 1024, "height": 768}  # the room: a 1024 x 768 projector
MIN_TEXT_PX = 11  # the smallest figure text a room can read off a projector (the bar)


def _png_dpi(src: str) -> float:
    """The dots per inch a PNG data URL declares (matplotlib writes its savefig dpi in pHYs)."""
    import base64
    import struct

    data = base64.b64decode(src.split(",", 1)[1])
    at = data.find(b"pHYs")
    if at < 0:
        raise ValueError("the PNG declares no pHYs (dpi): its text size cannot be told")
    per_unit, _, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    assert unit == 1, "pHYs in pixels per metre"
    return per_unit * 0.0254


def smallest_text_px(natural: float, shown: float, dpi: float) -> float:
    """The smallest figure text in screen pixels: every lesson figure's text is at least
    ``_style.MIN_FONT_PT`` points (``_style`` raises smaller text to it; the lesson tests check each
    figure), MIN_FONT_PT * dpi / 72 pixels in the PNG, drawn at ``shown / natural`` of its size."""
    from accumlib._style import MIN_FONT_PT

    return MIN_FONT_PT * dpi / 72 * shown / natural


def test_the_projector_check_can_fail():
    # the measurement before the fix: a 1001-px figure drawn 572 px wide, 10-pt text at 100 dpi
    assert 10 * 100 / 72 * 572 / 1001 < MIN_TEXT_PX
    assert smallest_text_px(natural=2000, shown=572, dpi=100) < MIN_TEXT_PX  # too wide a figure
    assert smallest_text_px(natural=1000, shown=1000, dpi=100) >= MIN_TEXT_PX


@pytest.mark.browser
@pytest.mark.timeout(2 * tb.BROWSER_TEST_TIMEOUT_S)
def test_every_figure_reads_on_a_1024x768_projector_with_the_file_browser_open(lab, page, request):
    """Every committed figure of every lesson and the course map, as JupyterLab draws it in a 1024 x 768
    window with its file browser open: its smallest text is at least 11 px on screen. A screenshot of
    each notebook's first figure goes to test-artifacts/browser/."""
    page.set_viewport_size(PROJECTOR)
    seen, small = [], []
    for name in tb.LESSONS:
        path = tb._need(name)
        open_notebook(page, lab, path)
        browser = page.locator("#filebrowser")
        if not browser.is_visible():
            page.keyboard.press("Control+Shift+F")  # JupyterLab's "show the file browser"
        browser.wait_for(state="visible", timeout=10_000)
        imgs = notebook(page).locator(".jp-OutputArea-output img")
        for i in range(imgs.count()):
            img = imgs.nth(i)
            img.scroll_into_view_if_needed()
            natural, shown, src = img.evaluate(
                "e => [e.naturalWidth, e.getBoundingClientRect().width, e.src]"
            )
            if not src.startswith("data:image/png"):
                continue
            px = smallest_text_px(natural, shown, _png_dpi(src))
            seen.append((name, i, natural, round(shown), round(px, 1)))
            if i == 0:
                img.screenshot(path=tb._artifact(request, f"{name}-figure-0"))
            if px < MIN_TEXT_PX:
                small.append(f"{name} figure {i}: {natural} px drawn {shown:.0f} px wide, text {px:.1f} px")
        lab.shutdown_kernel(path)
    tb._artifact(request, "figures", "json").write_text(json.dumps(seen, indent=1))
    assert len({s[0] for s in seen}) >= len(tb.LESSONS) - 1, seen  # every lesson with a figure was measured
    assert not small, "\n".join(small)
