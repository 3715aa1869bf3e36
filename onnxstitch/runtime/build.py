"""Build the onnxstitch custom-op library (``libonnxstitch_ops.so``).

Stages, in order:

1. ONNX Runtime C API headers: ``$ORT_INCLUDE_DIR``; else a system install
   (``/usr/include/onnxruntime``, Debian's ``libonnxruntime-dev``); else Debian 13 ("trixie")
   ``libonnxruntime-dev`` fetched with ``apt-get download`` through the Debian mirror this
   machine already uses, with a private sources list / lists dir / cache so the system's apt
   state is untouched, and unpacked with ``dpkg -x`` under the cache.
2. Compile ``csrc/*.cc`` with g++ (no CUDA toolkit needed: the driver API is declared in
   ``csrc/cuda_driver.h`` and loaded at run time).
3. Cache: ``<cache>/lib/<hash>/libonnxstitch_ops.so`` where ``<cache>`` is
   ``$ONNXSTITCH_CACHE`` or ``~/.cache/onnxstitch`` and ``<hash>`` covers the sources, the
   flags, the compiler version and the ORT C API header.

A wheel ships the library built by setup.py at ``PACKAGED_LIBRARY`` (``runtime/lib/``);
``packaged_library()`` finds it, and ``onnxstitch.library_path()`` prefers it to the cache.

``python -m onnxstitch.runtime.build`` builds (if needed) and prints the library path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LIBRARY_NAME = "libonnxstitch_ops.so"
CSRC = Path(__file__).resolve().parent / "csrc"
# Each scheme's runtime side (its launch.cc and headers) lives in its folder beside its Python.
SCHEMES = Path(__file__).resolve().parent.parent / "schemes"
# Where a wheel's build (setup.py) puts the library; absent from a source tree.
PACKAGED_LIBRARY = Path(__file__).resolve().parent / "lib" / LIBRARY_NAME
SYSTEM_ORT_INCLUDE = Path("/usr/include/onnxruntime")
DEBIAN_SUITE = "trixie"
DEBIAN_PACKAGE = "libonnxruntime-dev"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
C_API_HEADER = "onnxruntime_c_api.h"

CXXFLAGS: tuple[str, ...] = (
    "-O2",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
)
# -z defs: fail at build time on any unresolved symbol (we link neither ORT nor libcuda).
LDFLAGS: tuple[str, ...] = ("-ldl", "-Wl,-z,defs")


class BuildError(RuntimeError):
    """The library cannot be built; the message says what to install or set."""


def cache_root() -> Path:
    """The cache folder: ``$ONNXSTITCH_CACHE`` or ``~/.cache/onnxstitch``."""
    env = os.environ.get("ONNXSTITCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "onnxstitch"


def _has_c_api(include_dir: Path) -> bool:
    return (include_dir / C_API_HEADER).is_file()


def _fetched_include_dir() -> Path:
    return cache_root() / "ort-headers" / f"debian-{DEBIAN_SUITE}" / "usr" / "include" / "onnxruntime"


def find_ort_include(fetch: bool = True) -> Path:
    """Return a folder holding ``onnxruntime_c_api.h``, fetching Debian's headers if allowed.

    Raises BuildError when none is found (and ``fetch`` is False or fetching fails).
    """
    env = os.environ.get("ORT_INCLUDE_DIR")
    if env:
        path = Path(env).expanduser()
        if not _has_c_api(path):
            raise BuildError(f"ORT_INCLUDE_DIR={env} has no {C_API_HEADER}; point it at ONNX Runtime's include folder")
        return path
    if _has_c_api(SYSTEM_ORT_INCLUDE):
        return SYSTEM_ORT_INCLUDE
    fetched = _fetched_include_dir()
    if _has_c_api(fetched):
        return fetched
    if not fetch:
        raise BuildError(
            f"no ONNX Runtime C API headers: set ORT_INCLUDE_DIR or install {DEBIAN_PACKAGE}"
        )
    return fetch_debian_headers()


def _debian_mirror() -> str:
    """The Debian archive URL of this machine's apt configuration (not the security mirror)."""
    sources: list[Path] = []
    main_list = Path("/etc/apt/sources.list")
    if main_list.is_file():
        sources.append(main_list)
    parts = Path("/etc/apt/sources.list.d")
    if parts.is_dir():
        sources.extend(sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources")))
    candidates: list[str] = []
    for path in sources:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("#"):
                continue
            if path.suffix == ".sources":  # deb822: "URIs: a b"
                if line.lower().startswith("uris:"):
                    candidates.extend(line.split(":", 1)[1].split())
            else:  # one-line: "deb [options] URI suite components"
                m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
                if m:
                    candidates.append(m.group(1))
    for uri in candidates:
        u = uri.rstrip("/")
        if "debian" in u and "security" not in u and not u.endswith("-ports"):
            return u
    raise BuildError(
        "no Debian mirror in /etc/apt/sources.list{,.d}; set ORT_INCLUDE_DIR to ONNX Runtime's "
        f"include folder or install {DEBIAN_PACKAGE}"
    )


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def fetch_debian_headers() -> Path:
    """Download Debian trixie's libonnxruntime-dev (~85 KB) and unpack it under the cache.

    apt runs with a private sources list, lists dir and cache, so the system's apt state is
    never read for sources nor written.
    """
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise BuildError(
                f"no ONNX Runtime C API headers and no {tool} to fetch them: set ORT_INCLUDE_DIR "
                "to ONNX Runtime's include folder (e.g. from an onnxruntime release archive)"
            )
    mirror = _debian_mirror()
    dest_root = _fetched_include_dir().parents[2]  # .../debian-trixie
    with tempfile.TemporaryDirectory(prefix="onnxstitch-apt-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "lists" / "partial").mkdir(parents=True)
        (tmp / "cache" / "archives" / "partial").mkdir(parents=True)
        signed = f" [signed-by={DEBIAN_KEYRING}]" if DEBIAN_KEYRING.is_file() else ""
        sources = tmp / "sources.list"
        sources.write_text(f"deb{signed} {mirror} {DEBIAN_SUITE} main\n")
        opts = [
            "-o", f"Dir::Etc::sourcelist={sources}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={tmp / 'lists'}",
            "-o", f"Dir::Cache={tmp / 'cache'}",
            "-o", "Dir::Etc::preferencesparts=-",  # system pinning must not hide the package
            "-o", "Debug::NoLocking=1",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            opts += ["-o", "APT::Sandbox::User=root"]  # the _apt user cannot write our tmp dir
        res = _run(["apt-get", *opts, "update"])
        if res.returncode != 0:
            raise BuildError(
                f"apt-get update for Debian {DEBIAN_SUITE} at {mirror} failed "
                f"({_last_line(res.stderr)}); set ORT_INCLUDE_DIR to ONNX Runtime's include folder"
            )
        res = _run(["apt-get", *opts, "download", DEBIAN_PACKAGE], cwd=tmp)
        debs = sorted(tmp.glob(f"{DEBIAN_PACKAGE}_*.deb"))
        if res.returncode != 0 or not debs:
            raise BuildError(
                f"apt-get download {DEBIAN_PACKAGE} ({DEBIAN_SUITE}) failed ({_last_line(res.stderr)}); "
                "set ORT_INCLUDE_DIR to ONNX Runtime's include folder"
            )
        unpack = tmp / "unpacked"
        res = _run(["dpkg", "-x", str(debs[-1]), str(unpack)])
        include = unpack / "usr" / "include" / "onnxruntime"
        if res.returncode != 0 or not _has_c_api(include):
            raise BuildError(
                f"unpacking {debs[-1].name} gave no {C_API_HEADER} ({_last_line(res.stderr)}); "
                "set ORT_INCLUDE_DIR to ONNX Runtime's include folder"
            )
        # Publish atomically: a concurrent fetch either sees the whole tree or none.
        dest_root.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=".staged-", dir=dest_root.parent))
        shutil.move(str(unpack / "usr"), str(staged / "usr"))
        try:
            os.rename(staged, dest_root)
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)  # another process won the race
    if not _has_c_api(_fetched_include_dir()):
        raise BuildError(f"fetched headers are missing from {dest_root}; remove it and retry")
    return _fetched_include_dir()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        raise BuildError(f"C++ compiler '{cxx}' not found: install g++ (apt-get install g++) or set CXX")
    return path


def _sources() -> list[Path]:
    """The library's sources: runtime/csrc and every scheme's C++ files."""
    common = [p for p in CSRC.iterdir() if p.suffix in (".cc", ".h", ".map")]
    schemes = [p for p in SCHEMES.glob("*/*") if p.suffix in (".cc", ".h")]
    return sorted(common) + sorted(schemes)


def _hash_sources(h: "hashlib._Hash") -> None:
    for path in _sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")


def sources_digest() -> str:
    """SHA-256 (16 hex digits) of the library's sources, compiled in as ONNXSTITCH_SOURCES: what
    the library saves on disk (cuDNN plans, plan_cache.h) is keyed by it, so a library built from
    other sources never loads a plan made for graphs it no longer builds alike."""
    h = hashlib.sha256()
    _hash_sources(h)
    return h.hexdigest()[:16]


def _defines() -> tuple[str, ...]:
    """The macros every build compiles in (part of the cache key, as the flags are)."""
    return (f'-DONNXSTITCH_SOURCES="{sources_digest()}"',)


def build_command(
    include_dir: Path, output: Path, compiler: str | None = None, extra_flags: tuple[str, ...] = ()
) -> list[str]:
    """The exact compiler command line (also useful to reproduce a failed build)."""
    cxx = compiler or _compiler()
    ccs = [str(p) for p in _sources() if p.suffix == ".cc"]
    return [
        cxx,
        *CXXFLAGS,
        *extra_flags,
        *_defines(),
        f"-I{include_dir}",
        f"-I{CSRC}",
        *(f"-I{d}" for d in sorted({p.parent for p in _sources() if p.parent != CSRC})),
        "-o",
        str(output),
        *ccs,
        *LDFLAGS,
        f"-Wl,--version-script={CSRC / 'exports.map'}",
    ]


def _build_key(include_dir: Path, compiler: str, extra_flags: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    _hash_sources(h)
    h.update("\0".join(CXXFLAGS + LDFLAGS + _defines() + tuple(extra_flags)).encode())
    version = _run([compiler, "--version"]).stdout.splitlines()[:1]
    h.update((compiler + "\0" + "".join(version)).encode())
    h.update((include_dir / C_API_HEADER).read_bytes())
    return h.hexdigest()[:16]


def packaged_library() -> Path | None:
    """The library installed with the package (a wheel's ``runtime/lib/``), or None."""
    return PACKAGED_LIBRARY if PACKAGED_LIBRARY.is_file() else None


def cached_library(fetch_headers: bool = False) -> Path:
    """Where the library for the current sources/flags/headers lives (it may not exist yet)."""
    compiler = _compiler()
    include_dir = find_ort_include(fetch=fetch_headers)
    return cache_root() / "lib" / _build_key(include_dir, compiler) / LIBRARY_NAME


def build(force: bool = False, extra_flags: tuple[str, ...] = ()) -> Path:
    """Build the library into the cache unless it is already there; return its path.

    ``extra_flags`` (e.g. ``("-DONNXSTITCH_CPU_EP_FOR_TESTS",)``) become part of the cache key.
    """
    compiler = _compiler()
    include_dir = find_ort_include(fetch=True)
    target = cache_root() / "lib" / _build_key(include_dir, compiler, tuple(extra_flags)) / LIBRARY_NAME
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a private name, then rename: concurrent builds never see a partial file.
    fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = build_command(include_dir, tmp, compiler, tuple(extra_flags))
    res = _run(cmd)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        log = (res.stderr or res.stdout).strip()
        raise BuildError(f"compiling the custom-op library failed:\n{log}\ncommand: {' '.join(cmd)}")
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """CLI: build if needed and print the library path (``--force`` rebuilds)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        path = build(force="--force" in args)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
