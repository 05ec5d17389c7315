"""``accumlib.verify``: run a user's own training loop against the true large-batch gradient.

See ``verify`` for the API, ``CODES`` for the finding codes and their severity.
"""

from ._api import verify
from .report import CODES, Finding, Report, StepRow

__all__ = ["CODES", "Finding", "Report", "StepRow", "verify"]
