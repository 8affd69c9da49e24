"""Errors a user can fix. The CLI prints them as one clear line instead of a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment: the message names the file and the fix."""


class DamagedFileError(UserError, ValueError):
    """A file the project wrote that does not parse: a ValueError to code that expects one (a
    damaged marker or manifest read as "not ours"), one line naming the file to a user."""

    def __init__(self, path: object, why: str) -> None:
        super().__init__(f"{path} is damaged ({why}): restore it (`git checkout -- FILE` if it "
                         "is committed) or run the step that writes it again")
        self.why = why


class DataRootError(UserError, FileNotFoundError):
    """The raw-data root is missing or incomplete."""


class Interrupted(BaseException):
    """A signal (SIGTERM) asked the command to stop: raised, as Ctrl-C raises
    ``KeyboardInterrupt``, so that what is running is stopped and marked as such; the CLI then
    prints one line and exits 128 + the signal's number, as a shell reports a killed command."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted (signal {signum})")
        self.signum = signum
