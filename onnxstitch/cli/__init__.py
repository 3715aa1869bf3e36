"""The `onnxstitch` command line (installed as the package onnxstitch.cli)."""
from .main import main

__all__ = ["main"]
