"""Option parsing and error reporting shared by the commands."""
from __future__ import annotations

import functools
import logging
import sys
import traceback
from typing import Any, Callable

import click

from onnxstitch.errors import BadInputError, StitchError, first_line


def parse_shapes(values: tuple[str, ...]) -> dict[str, list[int]]:
    """`--shape batch=8,seq=128` or `--shape x=8x128` (repeatable) → name → dims."""
    out: dict[str, list[int]] = {}
    for value in values:
        for item in filter(None, value.split(",")):
            name, sep, dims = item.partition("=")
            try:
                if not sep or not name:
                    raise ValueError
                out[name.strip()] = [int(d) for d in dims.lower().split("x")]
            except ValueError:
                raise BadInputError(f"--shape {item!r}: expected name=value or input=DxDx...") from None
            if any(d < 0 for d in out[name.strip()]):
                raise BadInputError(f"--shape {item!r}: dims must be non-negative")
    return out


def verbosity(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds -v/-q and turns StitchError into one line on stderr with its exit status
    (a traceback only with -v)."""

    @click.option("-v", "--verbose", is_flag=True, help="More detail; tracebacks on errors.")
    @click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
    @functools.wraps(fn)
    def wrapper(*args: Any, verbose: bool, quiet: bool, **kwargs: Any) -> Any:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING if not quiet else logging.ERROR,
                            format="%(levelname)s %(name)s: %(message)s")
        if quiet:  # ONNX Runtime's own warnings (Memcpy nodes added, nodes on the CPU) go to stderr too
            import onnxruntime

            onnxruntime.set_default_logger_severity(3)
        try:
            return fn(*args, verbose=verbose, quiet=quiet, **kwargs)
        except StitchError as e:
            if verbose:
                traceback.print_exc()
            click.echo(f"onnxstitch: error: {e}", err=True)
            sys.exit(e.exit_code)
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException):
            raise
        except ModuleNotFoundError as e:  # the environment, not the model nor onnxstitch
            if verbose:
                traceback.print_exc()
            click.echo(f"onnxstitch: error: the Python package {e.name!r} is not installed in this environment "
                       f"(the README's install command installs every dependency)", err=True)
            sys.exit(1)
        except Exception as e:  # an unexpected failure is still one line unless -v
            if verbose:
                traceback.print_exc()
            click.echo(f"onnxstitch: internal error: {type(e).__name__}: {first_line(e)} (run with -v for details)", err=True)
            sys.exit(1)

    return wrapper


__all__ = ["parse_shapes", "verbosity", "BadInputError"]
