"""Errors a user can fix. The CLI prints them as one clear line instead of a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment: the message names the file and the fix."""


class DataRootError(UserError, FileNotFoundError):
    """The raw-data root is missing or incomplete."""
