"""Errors a user can act on. The CLI prints them as one line and exits with `exit_code`."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error report shows of a lower layer's failure."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class StitchError(Exception):
    """Base class: a one-line message naming the file or node it concerns."""

    exit_code = 1


class BadInputError(StitchError):
    """The model file or graph is unusable (missing, truncated, invalid). Exit status 2."""

    exit_code = 2


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON in the user's file `path`, which should hold `what` (a report, a zoo manifest);
    BadInputError naming the file when it cannot be read or is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: not a JSON {what} ({e})") from None


class CompileError(StitchError):
    """NVRTC rejected a generated kernel; carries the log and the source for reproduction."""

    def __init__(self, message: str, log: str = "", source: str = "") -> None:
        super().__init__(message)
        self.log = log
        self.source = source


# What a user can do when verification cannot run the original model at any sizes it tried.
SIZE_HINT = ("give sizes it runs at with --shape, values an input must hold with --value (an attention mask "
             "of ones), or --no-verify")
