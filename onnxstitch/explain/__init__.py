"""A picture of the plan (`optimize --plan-picture`, `onnxstitch explain`): the model graph with
each fused group one coloured, labelled box, drawn from --report's JSON alone, so a picture can
be made after the fact. Repeated identical layers of a large graph are drawn once (repeats.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import BadInputError
from .outline import GraphOutline, outline

__all__ = ["GraphOutline", "outline", "render", "write", "FORMATS"]

FORMATS = {".svg": "svg", ".html": "html", ".htm": "html"}


def render(report: Mapping[str, Any], fmt: str = "svg", title: str = "onnxstitch plan",
           max_whole: int | None = None) -> str:
    """The plan of `report` (Report.to_json) as an SVG document (`fmt` "svg") or a
    self-contained HTML page ("html"). Repeated layers are collapsed when there are more than
    `max_whole` boxes (repeats.MAX_WHOLE by default). BadInputError when the report has no
    graph outline."""
    # Imported here: the layout library is needed only to draw, not to optimize.
    from . import draw, repeats, view

    v = repeats.collapse(view.from_report(report), repeats.MAX_WHOLE if max_whole is None else max_whole)
    return draw.html(v, title) if fmt == "html" else draw.svg(v, title)


def format_of(path: str | os.PathLike) -> str:
    """"svg" or "html" by `path`'s suffix; BadInputError for any other."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise BadInputError(f"{path}: a plan picture is written as .svg or .html")
    return fmt


def write(report: Mapping[str, Any], path: str | os.PathLike, title: str = "onnxstitch plan") -> None:
    """Write the picture of `report` to `path`, as SVG or HTML by its suffix."""
    text = render(report, format_of(path), title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
