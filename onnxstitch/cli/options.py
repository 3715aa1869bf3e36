"""Option parsing and error reporting shared by the commands."""
from __future__ import annotations

import functools
import logging
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from onnxstitch import sizes
from onnxstitch.errors import BadInputError, StitchError, first_line


def missing_module(e: ModuleNotFoundError) -> str:
    """What a missing module means: a part of onnxstitch itself missing is a broken
    installation of onnxstitch (a package its wheel left out), not the user's environment; any
    other module is a dependency this environment lacks."""
    name = e.name or str(e)
    if name == "onnxstitch" or name.startswith("onnxstitch."):
        import onnxstitch

        return (f"this installation of onnxstitch {onnxstitch.__version__} is broken: its module {name!r} is "
                f"missing from {Path(onnxstitch.__file__).parent} (reinstall onnxstitch; if that does not help, "
                f"the package itself is at fault: please report it)")
    return (f"the Python package {name!r} is not installed in this environment "
            f"(the README's install command installs every dependency)")


def _usage_error(parse: Callable[[tuple[str, ...]], dict], flag: str) -> Callable[..., dict]:
    """A click callback running `parse`; what it refuses is a usage error (exit status 2) on `flag`."""

    def callback(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict:
        try:
            return parse(values)
        except BadInputError as e:
            raise click.BadParameter(str(e).removeprefix(f"{flag} "), param_hint=f"'{flag}'") from None

    return callback


def shape_option(help_text: str) -> Callable[..., Any]:
    """`--shape` (repeatable), parsed by sizes.parse into the command's `shapes`."""
    return click.option("--shape", "shapes", multiple=True, callback=_usage_error(sizes.parse, "--shape"),
                        help=help_text)


value_option = click.option(
    "--value", "values", multiple=True, callback=_usage_error(sizes.parse_values, "--value"),
    help="An input that takes one value wherever onnxstitch makes inputs (verification, timing): "
         "--value sr=16000 for a sample rate or a flag the model branches on (repeatable).")

custom_ops_option = click.option(
    "--custom-op-library", "custom_op_libraries", multiple=True, type=click.Path(path_type=Path),
    help="A custom-op library the model's own ops need (onnxruntime-extensions, your own; repeatable): "
         "registered in every ONNX Runtime session onnxstitch opens.")


def verbosity(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds -v/-q and turns StitchError into one line on stderr with its exit status
    (a traceback only with -v)."""

    @click.option("-v", "--verbose", is_flag=True, help="More detail; tracebacks on errors.")
    @click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
    @functools.wraps(fn)
    def wrapper(*args: Any, verbose: bool, quiet: bool, **kwargs: Any) -> Any:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING if not quiet else logging.ERROR,
                            # -v: milliseconds since start, to see where optimize's time goes
                            format="%(relativeCreated)7.0f ms %(levelname)s %(name)s: %(message)s" if verbose
                            else "%(levelname)s %(name)s: %(message)s")
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
        except ModuleNotFoundError as e:
            if verbose:
                traceback.print_exc()
            click.echo(f"onnxstitch: error: {missing_module(e)}", err=True)
            sys.exit(1)
        except Exception as e:  # an unexpected failure is still one line unless -v
            if verbose:
                traceback.print_exc()
            click.echo(f"onnxstitch: internal error: {type(e).__name__}: {first_line(e)} (run with -v for details)", err=True)
            sys.exit(1)

    return wrapper


__all__ = ["verbosity", "missing_module", "shape_option", "value_option", "custom_ops_option", "BadInputError"]
