"""Files of a public repository, pinned by commit and sha256, read at test time from a local clone.

Upstream code is never committed here: tests/_hf_scripts.py (Accelerate's examples) and tests/_nanogpt.py
(nanoGPT's train.py) each pin their files in a dict ``{name: {"repo", "path", "commit", "sha256"}}`` and read
them out of a clone named by an environment variable. The reading is one piece of code, here, so that both
pin the same way: the bytes are ``git show COMMIT:PATH`` of the clone's git directory (a work tree's later
edits never count), hashed with ``sha256``. What differs stays with each module: the variable, the pins,
whether a variable naming nothing is a skip or an error, and the message when a hash does not match.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path


def sha256(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def source(env_var: str, *, clone_of: str | None = None) -> Path | None:
    """The clone named by the environment variable ``env_var``; None where it is unset or empty.

    A value naming nothing is None as well (the tests skip), unless ``clone_of`` (the upstream's URL) is
    given: then it is a FileNotFoundError saying to point ``env_var`` at a clone of it, so that a mistyped
    path fails instead of passing as a skip.
    """
    value = os.environ.get(env_var)
    if not value:
        return None
    if not Path(value).exists():
        if clone_of is None:
            return None
        raise FileNotFoundError(f"{env_var}={value} names nothing: point it at a clone of {clone_of}")
    return Path(value)


def upstream_bytes(pins: Mapping[str, Mapping[str, str]], name: str, src: Path) -> bytes:
    """The file ``pins[name]`` at its commit, read from the clone ``src`` (work tree or git directory).

    ``pins`` is read at each call, so a test that swaps a pin (``monkeypatch.setitem``) is read as swapped.
    """
    pin = pins[name]
    git_dir = src / ".git" if (src / ".git").exists() else src
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{pin['commit']}:{pin['path']}"],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise FileNotFoundError(f"{pin['path']} at {pin['commit']} is not in {src}: {out.stderr.decode()}")
    return out.stdout
