"""The course on a projector: every committed lesson figure, as JupyterLab draws it in a 1024 x 768
window with its file browser open, keeps its smallest text at or above 11 px on screen (issue 30).

``committed_figures_on_a_projector`` runs inside each lesson's browser test (tests/test_browser.py), on
the page that test has just opened, before its Run All: one JupyterLab page load per lesson serves both
(the check had its own, 146 s of the suite's time). The arithmetic's own check is here.
"""

from __future__ import annotations

import nbformat
from _jupyter import notebook

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
    from accumlib_course._style import MIN_FONT_PT

    return MIN_FONT_PT * dpi / 72 * shown / natural


def test_the_projector_check_can_fail():
    # the measurement before the fix: a 1001-px figure drawn 572 px wide, 10-pt text at 100 dpi
    assert 10 * 100 / 72 * 572 / 1001 < MIN_TEXT_PX
    assert smallest_text_px(natural=2000, shown=572, dpi=100) < MIN_TEXT_PX  # too wide a figure
    assert smallest_text_px(natural=1000, shown=1000, dpi=100) >= MIN_TEXT_PX


def committed_figures_on_a_projector(page, root, path: str, screenshot) -> list[str]:
    """The notebook ``path`` just opened on ``page``: in a 1024 x 768 window with the file browser open,
    every committed PNG figure's smallest text in screen pixels, as problems (none: all at least 11 px).
    ``screenshot(label)`` gives the path for the first figure's picture. The page is left as found."""
    before = page.viewport_size
    committed = sum(
        "image/png" in out.get("data", {})
        for cell in nbformat.read(root / path, as_version=4).cells
        for out in cell.get("outputs", [])
    )
    page.set_viewport_size(PROJECTOR)
    browser = page.locator("#filebrowser")
    shown_before = browser.is_visible()
    if not shown_before:
        page.keyboard.press("Control+Shift+F")  # JupyterLab's "show the file browser"
    browser.wait_for(state="visible", timeout=10_000)
    problems, measured = [], 0
    imgs = notebook(page).locator(".jp-OutputArea-output img")
    for i in range(imgs.count()):
        img = imgs.nth(i)
        img.scroll_into_view_if_needed()
        natural, shown, src = img.evaluate("e => [e.naturalWidth, e.getBoundingClientRect().width, e.src]")
        if not src.startswith("data:image/png"):
            continue
        measured += 1
        if measured == 1:
            img.screenshot(path=screenshot("projector-figure-0"))
        px = smallest_text_px(natural, shown, _png_dpi(src))
        if px < MIN_TEXT_PX:
            problems.append(
                f"projector: figure {i}: {natural} px drawn {shown:.0f} px wide, text {px:.1f} px"
            )
    if measured < committed:  # every committed figure was found on the page and measured
        problems.append(f"projector: {measured} of the {committed} committed figures measured")
    if not shown_before:
        page.keyboard.press("Control+Shift+F")
    page.set_viewport_size(before)
    return problems
