"""Installs as stated (offline, fast): every place that names a Python version agrees with pyproject's
`requires-python`, the pinned set installs on that minimum, and Binder's pins do not contradict
repo2docker's base environment.

The pinned distributions' own `Requires-Python` is read from their installed metadata in this
environment (`make install` installed exactly the pins; a test below checks that). The online half,
a fresh venv built as repo2docker builds Binder and the course map opened in Chromium, is
`make binder-check` (tools/binder_check.py; it needs PyPI, so it is not part of `make test`).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import _docs
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import binder_check  # noqa: E402

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REQUIRES_PYTHON = SpecifierSet(PYPROJECT["project"]["requires-python"])
# Every CPython release a specifier could start at, oldest first (3.8.0 ... 3.14.30).
CANDIDATES = [Version(f"3.{minor}.{patch}") for minor in range(8, 15) for patch in range(31)]


def floor(spec: SpecifierSet) -> Version:
    """The oldest CPython release `spec` admits."""
    admitted = [v for v in CANDIDATES if v in spec]
    if not admitted:
        raise ValueError(f"no CPython 3.8-3.14 release satisfies {spec}")
    return admitted[0]


def pins() -> dict[str, str]:
    return {
        name: version
        for name, version in (
            line.split("#", 1)[0].strip().split("==")
            for line in (REPO / "constraints.txt").read_text().splitlines()
            if "==" in line.split("#", 1)[0]
        )
    }


def pinned_floors() -> dict[str, Version]:
    """{pinned distribution: the oldest Python its pinned version installs on}."""
    out = {}
    for name, version in pins().items():
        dist = md.distribution(name)
        assert dist.version.split("+")[0] == version, (
            f"{name}: constraints.txt pins {version}, .venv has {dist.version}"
        )
        out[name] = floor(SpecifierSet(dist.metadata.get("Requires-Python") or ""))
    return out


def floor_mismatch(stated: SpecifierSet, floors: dict[str, Version]) -> str | None:
    """Why `stated` does not start exactly where the pinned set (`floors`, as `pinned_floors()` gives) starts
    installing, or None when it does: the pins that refuse its first release, or that none needs it."""
    lowest, needed = floor(stated), max(floors.values())
    if lowest < needed:
        refusing = ", ".join(f"{n} needs {f}" for n, f in sorted(floors.items()) if f > lowest)
        return f"requires-python {stated} admits Python {lowest}, which the pins refuse ({refusing})"
    if lowest > needed:
        return f"requires-python {stated} starts at Python {lowest}; no pin needs more than {needed}"
    return None


def shown(version: Version) -> str:
    """A floor as the README writes it: 3.11 for 3.11.0, 3.11.5 for 3.11.5."""
    return f"{version.major}.{version.minor}" + (f".{version.micro}" if version.micro else "")


def readme_minimums(text: str) -> list[str]:
    """Every "Python ≥ X.Y[.Z]" in `text`, as written."""
    return re.findall(r"Python\s*(?:≥|>=)\s*(\d+\.\d+(?:\.\d+)?)", text)


def admits_minor(spec: SpecifierSet, minor: Version) -> bool:
    """Whether `spec` admits some CPython release of `minor` (3.11: any of 3.11.0 ... 3.11.30)."""
    return any(v in spec for v in CANDIDATES if v.release[:2] == minor.release[:2])


MINIMUM = floor(REQUIRES_PYTHON)
STATED = shown(MINIMUM)


def test_floor_reads_a_specifier():
    assert floor(SpecifierSet(">=3.11")) == Version("3.11.0")
    assert floor(SpecifierSet(">=3.11.5")) == Version("3.11.5")
    assert floor(SpecifierSet("!=3.8.*,>=3.8")) == Version("3.9.0")
    assert floor(SpecifierSet("")) == Version("3.8.0")
    with pytest.raises(ValueError, match="no CPython"):
        floor(SpecifierSet(">=4"))


def test_requires_python_is_the_pinned_sets_floor():
    """The stated minimum is the first Python the whole pinned set installs on, to the patch release:
    not lower (3.10 was stated while numpy 2.4.6, SciPy 1.17 and IPython 9 refuse it; 3.11 while
    soupsieve 4.1.2 refuses 3.11.0-3.11.4), not higher than any pin asks."""
    floors = pinned_floors()
    assert floor_mismatch(REQUIRES_PYTHON, floors) is None, floor_mismatch(REQUIRES_PYTHON, floors)
    # The previous minor is refused by the pins the issue named: the minor is needed, not cosmetic.
    previous = Version(f"{MINIMUM.major}.{MINIMUM.minor - 1}.99")
    refusing = {n for n, f in floors.items() if f > previous}
    assert {"numpy", "scipy", "ipython"} <= refusing
    assert previous not in REQUIRES_PYTHON


def test_a_floor_off_by_a_patch_release_is_caught():
    """The check compares the whole floor, patch included: `>=3.11` (stated until soupsieve 4.1.2 was
    seen to need 3.11.5) is refused, naming soupsieve alone; a floor above every pin's is refused too."""
    floors = pinned_floors()
    needed = max(floors.values())
    assert needed == Version("3.11.5")  # soupsieve 4.1.2's Requires-Python; the cases below assume it
    found = floor_mismatch(SpecifierSet(">=3.11"), floors)
    assert (
        found == "requires-python >=3.11 admits Python 3.11.0, which the pins refuse (soupsieve needs 3.11.5)"
    )
    below = floor_mismatch(SpecifierSet(">=3.10"), floors)
    assert all(f"{n} needs 3.11" in below for n in ("numpy", "scipy", "ipython", "soupsieve")), below
    above = floor_mismatch(SpecifierSet(">=3.11.6"), floors)
    assert above == "requires-python >=3.11.6 starts at Python 3.11.6; no pin needs more than 3.11.5"
    assert floor_mismatch(SpecifierSet(">=3.11.5"), floors) is None


def test_readme_states_the_minimum():
    """The README says "Python ≥ 3.11.5" wherever it states a minimum: the floor to the patch release
    where the pins need one (a learner on 3.11.4 would otherwise be told the install works)."""
    stated = readme_minimums(_docs.text())
    assert stated, "the README states no minimum Python (Python ≥ X.Y)"
    assert set(stated) == {STATED}, (
        f"README says Python ≥ {stated}; pyproject's requires-python is {REQUIRES_PYTHON}"
    )


def test_the_readme_check_reads_the_patch_release():
    assert readme_minimums("Python ≥ 3.11 (or Python >= 3.11.5)") == ["3.11", "3.11.5"]
    assert shown(Version("3.11.0")) == "3.11" and shown(Version("3.11.5")) == "3.11.5"
    assert {"3.11"} != {shown(Version("3.11.5"))}  # the README's old "Python ≥ 3.11" fails the check


def test_classifiers_agree_with_requires_python():
    classifiers = PYPROJECT["project"]["classifiers"]
    versions = [
        Version(c.rsplit("::", 1)[1])
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions, "no 'Programming Language :: Python :: 3.X' classifier"
    assert min(versions).release == MINIMUM.release[:2], (
        f"classifiers start at {min(versions)}, requires-python at {STATED}"
    )
    assert all(admits_minor(REQUIRES_PYTHON, v) for v in versions)
    assert not admits_minor(SpecifierSet(">=3.12"), Version("3.11"))
    assert "Programming Language :: Python :: 3 :: Only" in classifiers


def test_binder_and_conda_pythons_are_admitted():
    """binder/runtime.txt and environment.yml name a minor; repo2docker and conda install its newest
    patch release, which requires-python must admit."""
    python = binder_check.binder_python()
    assert Version(f"{python}.99") in REQUIRES_PYTHON, (
        f"binder/runtime.txt asks for Python {python}; requires-python is {REQUIRES_PYTHON}"
    )
    conda = re.search(
        r"^\s*-\s*python\s*=\s*(\d+\.\d+)\s*(#.*)?$", (REPO / "environment.yml").read_text(), re.M
    )
    assert conda, "environment.yml pins no python=X.Y"
    assert Version(f"{conda.group(1)}.99") in REQUIRES_PYTHON


def test_this_environment_is_one_the_readme_admits():
    assert Version("{}.{}.{}".format(*sys.version_info[:3])) in REQUIRES_PYTHON


# --- Binder: binder/requirements.txt on top of repo2docker's base environment -------------------


def binder_pins() -> dict[str, str]:
    return binder_check.binder_pins()


def base_pins() -> dict[str, str]:
    return binder_check.base_pins(binder_check.base_lock(binder_check.binder_python()))


def test_base_environment_is_read():
    base = base_pins()
    # The front end repo2docker ships, and no C library or meta-package taken for a wheel.
    assert {"jupyterlab", "notebook", "jupyter-server", "jupyterhub", "ipykernel"} <= base.keys()
    assert (
        not {"python", "nodejs", "libgcc", "jupyterhub-singleuser", "bleach-with-css", "openssl"}
        & base.keys()
    )
    assert base["jupyterlab"].startswith("4.") and base["notebook"].startswith("7.")


def test_binder_pins_are_read_through_the_constraints_file():
    binder = binder_pins()
    assert binder["torch"] == "2.13.0+cpu"  # binder/requirements.txt itself
    assert binder["jupyterlab"] == pins()["jupyterlab"]  # through -c ../constraints.txt


def test_binder_pins_do_not_contradict_the_base_environment():
    assert binder_check.contradictions(base_pins(), binder_pins()) == []


def test_binder_pins_its_notebook_front_end():
    assert binder_pins()["notebook"] == "7.6.5"  # binder/postBuild, the last word


def test_the_old_binder_requirements_are_caught():
    """Without its own notebook pin, Binder kept the base's notebook 7.4 beside JupyterLab 4.6."""
    base, binder = base_pins(), binder_pins()
    binder.pop("notebook", None)
    found = binder_check.contradictions(base, binder)
    assert len(found) == 1 and f"notebook {base['notebook']} (from the base environment)" in found[0]
    assert f"pin notebook==7.{Version(binder['jupyterlab']).minor}.*" in found[0]


def test_a_downgrade_below_the_base_is_caught():
    base = base_pins()
    binder = binder_pins() | {"tornado": "6.0.0"}
    found = binder_check.contradictions(base, binder)
    assert len(found) == 1 and found[0].startswith(
        f"tornado: Binder pins 6.0.0, below the base environment's {base['tornado']}"
    )


def test_postbuild_pins_reads_pip_installs(tmp_path):
    script = tmp_path / "postBuild"
    script.write_text(
        "#!/bin/bash\n# pip install old==0.1\nset -e\n"
        "python -m pip install --no-cache-dir Note_Book==7.6.5 x>=1\necho a==b\n"
    )
    assert binder_check.postbuild_pins(script) == {"note-book": "7.6.5"}
    assert binder_check.postbuild_pins(tmp_path / "missing") == {}


def test_requirement_pins_follows_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "c.txt").write_text("Foo_Bar==1.2  # pinned\nbaz>=2\n")
    (tmp_path / "sub" / "r.txt").write_text(
        "-c ../c.txt\nqux[extra]==3.0+cpu ; python_version>'3'\n# x==9\n-e .[notebooks]\n"
    )
    assert binder_check.requirement_pins(tmp_path / "sub" / "r.txt") == {"foo-bar": "1.2", "qux": "3.0+cpu"}
