"""The script the course ships for ``accumlib run`` (accumlib_course/examples/scripts/train_gpt_shape.py) is
the README's, byte for byte: lesson 7 runs the file, tests/test_run_cli.py runs the README's text and compares
its report with the README's, so the two must be one script. The file is kept as the README shows it (ruff
leaves it alone: pyproject's extend-exclude), and pytest does not import it (addopts' --ignore): importing
a script runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import _docs

import accumlib_course.examples

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(accumlib_course.examples.__file__).parent / "scripts" / "train_gpt_shape.py"
HEADING = "## Judge a training script as it is: `accumlib run`"
SCALE = "        loss = loss / accum  # scale the loss for accumulation\n"


def _readme_blocks(readme: str) -> list[str]:
    section = readme[readme.index(HEADING) :]
    section = section[: section.index("\n## ", len(HEADING))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readmes_script_is_the_shipped_file_byte_for_byte():
    blocks = _readme_blocks(_docs.text())
    assert len(blocks) == 1, f"the section shows {len(blocks)} python blocks"
    assert blocks[0].encode() == SCRIPT.read_bytes()


def test_the_comparison_sees_a_one_character_change():
    text = SCRIPT.read_text()
    readme = f"{HEADING}\n\n```python\n{text.replace('5.0)', '1.0)')}```\n\n## Next\n"
    assert _readme_blocks(readme) != [text]
    assert _readme_blocks(readme.replace("1.0)", "5.0)")) == [text]


def test_the_line_lesson_7_deletes_is_line_38_once():
    """Lesson 7 (and the README) delete line 38, the loss scaling, to show `unscaled-sum` at its line."""
    lines = SCRIPT.read_text().splitlines(keepends=True)
    assert lines.count(SCALE) == 1 and lines[37] == SCALE
