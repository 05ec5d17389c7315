"""Outputs that mean the same on every CPU: the comparison rule of tests/_any_machine.py, the perturbation
that stands in for another CPU's kernels, and the report notebook run under it.

The README examples run perturbed in tests/test_readme.py; here the papermill report notebook is executed
top to bottom with every model's initial parameters moved by a relative 1e-7, and every output nbval
compares must still be what is committed, up to float32 rounding (an AMD host once named "k = 8" where
the committed Intel output said "k = 4").
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import nbformat
import pytest
import torch
from _any_machine import PERTURBATION, assert_same_printout, differences, perturbed_init, same_number
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]


# --- the rule --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        ("1.22e-07", "1.36e-07"),  # two rounding residues of exact steps
        ("1.2e-07", "1.4e-07"),  # a tolerance measured from the run ("judged against" column)
        ("1.0000", "0.9999"),  # one number on two sides of a rounding boundary
        ("0.75", "0.75"),
        ("7.99", "7.99"),
    ],
)
def test_numbers_the_same_within_float32_rounding(a, b):
    assert same_number(a, b) and same_number(b, a)


@pytest.mark.parametrize(
    "a, b",
    [
        ("0.5", "0.75"),  # normalized's two errors
        ("2.35e-01", "1.22e-07"),  # a bug against a residue
        ("2.1e-04", "1.2e-07"),  # just above the residue bound: a result, not rounding
        ("1.0000", "0.9997"),  # three units apart at 4 decimals: not a boundary
        ("0.911", "0.913"),
    ],
)
def test_numbers_that_differ_beyond_rounding(a, b):
    assert not same_number(a, b) and not same_number(b, a)


def test_words_and_whole_numbers_are_compared_exactly():
    shown = "step 0  items 299  rel err 1.22e-07  ok\nverdict: OK"
    assert differences("step 0  items 299  rel err 1.36e-07  ok\nverdict: OK  \n", shown) == []
    for wrong in (
        "step 0  items 298  rel err 1.22e-07  ok\nverdict: OK",  # a count
        "step 0  items 299  rel err 1.22e-07  misscaled\nverdict: NOT OK",  # a verdict
        "step 0  items 299  rel err 0.25  ok\nverdict: OK",  # a residue that became a result
        "step 0  items 299  rel err 1.22e-07  ok",  # a line missing
        "at k = 8: 1.22e-07",
    ):
        assert differences(wrong, shown), wrong
    with pytest.raises(AssertionError, match="298"):
        assert_same_printout(shown.replace("299", "298"), shown)


def test_a_version_or_a_name_is_a_word_not_a_number():
    assert differences("transformers 5.23.0, float32", "transformers 5.23.1, float32")
    assert differences("a float16 run", "a float32 run")


# --- the perturbation ------------------------------------------------------------------------------------


def test_perturbed_init_moves_every_parameter_by_about_one_rounding_and_leaves_the_rng_alone():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Embedding(10, 8))
    after_plain = torch.rand(3)
    torch.manual_seed(0)
    with perturbed_init() as moved:
        perturbed = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Embedding(10, 8))
    after_perturbed = torch.rand(3)
    assert moved.tensors == 3  # the Linear's weight and bias, the Embedding's weight
    assert torch.equal(after_plain, after_perturbed)  # the run goes on with the same random stream
    for p, q in zip(plain.parameters(), perturbed.parameters()):
        rel = ((q.double() - p.double()).abs() / p.double().abs()).max().item()
        assert 0 < rel <= PERTURBATION + 2**-24  # moved, by the perturbation plus one float32 rounding
        assert not torch.equal(p, q)
    # outside the block nothing is perturbed
    torch.manual_seed(0)
    again = torch.nn.Linear(64, 32)
    assert torch.equal(again.weight, plain[0].weight)


# --- the report notebook, perturbed ----------------------------------------------------------------------


def _sanitize(text: str) -> str:
    """nbval's own sanitizers (notebooks/sanitize.cfg), applied as nbval applies them."""
    config = configparser.ConfigParser()
    config.read(REPO / "notebooks" / "sanitize.cfg")
    for section in config.sections():
        text = re.sub(config[section]["regex"], config[section]["replace"], text)
    return text


def _texts(cell) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append(o["text"])
        elif "data" in o and "text/plain" in o["data"]:
            out.append(o["data"]["text/plain"])
    return [_sanitize(t) for t in out]


PERTURB_CELL = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
from _any_machine import perturbed_init
_perturbation = perturbed_init()
_moved = _perturbation.__enter__()
"""


@pytest.mark.slow
def test_the_report_notebook_prints_the_same_with_its_models_perturbed(tmp_path):
    committed = nbformat.read(REPO / "notebooks" / "report.ipynb", as_version=4)
    nb = nbformat.read(REPO / "notebooks" / "report.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PERTURB_CELL))
    nb.cells.append(nbformat.v4.new_code_cell("print(_moved.tensors)"))
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    moved = int(nb.cells[-1]["outputs"][0]["text"])
    assert moved > 0, "the report built no model through torch's initialisers: nothing was perturbed"
    compared = 0
    for ran, kept in zip(nb.cells[1:-1], committed.cells):
        tags = kept.get("metadata", {}).get("tags", [])
        if kept.cell_type != "code" or "nbval-ignore-output" in tags or "nbval-skip" in tags:
            continue
        shown, printed = _texts(kept), _texts(ran)
        assert len(shown) == len(printed), kept.source
        for a, s in zip(printed, shown):
            assert_same_printout(a, s)
            compared += 1
    assert compared >= 4  # the findings, the loop table, the memory and norm tables, the results note
