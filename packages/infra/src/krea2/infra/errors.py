"""User-facing errors: one clear message naming the bad value and the fix, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix (bad config, bad flag, missing file).

    The ``krea2`` CLI host prints ``error: <message>`` and exits with status 2
    instead of showing a traceback.
    """

    exit_code = 2
