"""A deployable folder (``onnxstitch optimize MODEL --bundle DIR``): the stitched model with
its weights file, a copy of the custom-op library, and a README.txt saying how to load them
from Python, C/C++ and other ONNX Runtime bindings."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import StitchError, first_line
from .runtime import build as rtbuild

README_NAME = "README.txt"


class LibraryMissingError(StitchError):
    """There is no custom-op library to put in a bundle. Exit status 2: the user builds it."""

    exit_code = 2


@dataclass(frozen=True)
class Bundle:
    """What a bundle folder holds (every path inside ``directory``)."""

    directory: Path
    model: Path
    data: tuple[Path, ...]  # external weight files the model reads, beside it
    library: Path
    readme: Path


def find_library() -> Path:
    """The custom-op library to bundle (``onnxstitch.library_path()``, never building it).
    Raises LibraryMissingError naming ``onnxstitch build-library`` when there is none."""
    from .runtime import library_path

    try:
        return library_path(build=False)
    except (FileNotFoundError, rtbuild.BuildError) as e:
        raise LibraryMissingError(f"no custom-op library to bundle ({first_line(e)}); "
                                  "run `onnxstitch build-library` first, or install the onnxstitch wheel") from None


def write_bundle(model: Path, written: Sequence[Path], library: Path) -> Bundle:
    """Complete the bundle around `model` (already saved in its folder; `written` is every file
    its save wrote there): copy `library` beside it and write the README."""
    directory = model.parent
    target = directory / rtbuild.LIBRARY_NAME
    if library.resolve() != target.resolve():
        # A private name, then a rename: a reader never sees half a library.
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
        os.close(fd)
        try:
            shutil.copyfile(library, tmp)
            os.chmod(tmp, 0o755)  # mkstemp's 0600 would hide the library from other users
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    data = tuple(sorted(p for p in written if p.name != model.name))
    readme = directory / README_NAME
    readme.write_text(readme_text(model.name, [p.name for p in data]))
    return Bundle(directory, model, data, target, readme)


def readme_text(model: str, data: Sequence[str]) -> str:
    """The bundle's README.txt: its files, how to load them, and why it must be trusted."""
    lib = rtbuild.LIBRARY_NAME
    weights = "".join(f"  {d:<34} its weights (keep beside the model)\n" for d in data)
    return f"""\
onnxstitch bundle: a model whose memory-bound parts run as fused CUDA kernels in ONNX Runtime.

Files
  {model:<34} the stitched model
{weights}  {lib:<34} the custom-op library (Linux x86_64; runs com.onnxstitch::FusedKernel)

Run it with ONNX Runtime's CUDA execution provider (onnxruntime-gpu) and the library
registered in the session options (give its full path, or a path relative to the working
directory: the library name is looked up as dlopen does).

Python
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.register_custom_ops_library("/path/to/bundle/{lib}")
    sess = ort.InferenceSession("/path/to/bundle/{model}", so,
                                providers=["CUDAExecutionProvider", "CPUExecutionProvider"])

C++
    Ort::Env env;
    Ort::SessionOptions so;
    so.RegisterCustomOpsLibrary(ORT_TSTR("/path/to/bundle/{lib}"));
    so.AppendExecutionProvider_CUDA(OrtCUDAProviderOptions{{}});
    Ort::Session session(env, ORT_TSTR("/path/to/bundle/{model}"), so);

C: OrtApi::RegisterCustomOpsLibrary_V2(options, path). Other bindings call the same function
through their SessionOptions (C#: RegisterCustomOpLibraryV2; Java: registerCustomOpLibrary).

Without the CUDA execution provider, do not register the library: every fused node is also an
ONNX function holding the original operators, which any ONNX Runtime (CPU included) runs when
the library is not registered. With the library registered and no CUDA EP, session creation
fails with NOT_IMPLEMENTED on the first fused node.

Security: the stitched model carries executable GPU code (compiled cubins and PTX in its fused
nodes' attributes), which the library loads and launches on the GPU as it is. Treat the model
file like a binary: run only bundles from a source you trust, and keep the model and the
library from the same onnxstitch release together.
"""
