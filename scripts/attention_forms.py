"""Every Softmax between two MatMuls in the corpus transformers, and what optimize made of it.

For each model (default: the corpus models built from transformers, both exporters), a census
taken on the ONNX file itself, apart from the matcher — a Softmax whose input a MatMul's output
reaches within BACK nodes and whose output reaches a MatMul within AHEAD nodes — is compared with
optimize's report (verify off unless --verify): each such Softmax must be in an attention
kernel the plan chose, or named by a line of the report's attention refusals (a chain the
matcher refused, with why, or one the plan found cheaper to run otherwise). One that is neither
is "unaccounted", and the exit status is then 1.

    scripts/attention_forms.py [MODEL ...] [--corpus build/corpus] [--json out.json] [-v]

-v prints each Softmax with its status and the report's line; --forms prints the op types met on
the way back to the first MatMul and on to the second (the exporters' forms).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxstitch  # noqa: E402

BACK, AHEAD = 6, 4  # nodes walked from the Softmax to each MatMul


@dataclass
class Core:
    """One Softmax of the census."""

    softmax: str
    form: str  # the op types between the MatMuls, e.g. "MatMul[Mul,Mul] > Add > Softmax > IsNaN+Where > MatMul"
    status: str = "unaccounted"  # "kernel", "refused" or "unaccounted"
    why: str = ""  # the report's line naming it, for refusals


@dataclass
class ModelForms:
    model: str
    cores: list[Core] = field(default_factory=list)
    kernels: int = 0  # attention groups in the plan

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cores)


def _path_back(producer: dict, t: str, depth: int) -> list[str] | None:
    """Op types from the nearest MatMul (within `depth` nodes, any input) up to `t`'s producer."""
    n = producer.get(t)
    if n is None or depth == 0:
        return None
    if n.op_type == "MatMul":
        ops = [producer[u].op_type if u in producer else "input" for u in n.input[:2]]
        return [f"MatMul[{','.join(ops)}]"]
    paths = [p for u in n.input if u for p in [_path_back(producer, u, depth - 1)] if p is not None]
    return min(paths, key=len) + [n.op_type] if paths else None


def _path_ahead(readers: dict, t: str, depth: int) -> list[str] | None:
    """The readers met from `t` on, one step per entry, until a MatMul reads (within `depth`)."""
    if depth == 0:
        return None
    here = readers.get(t, [])
    if any(r.op_type == "MatMul" for r in here):
        return ["+".join(r.op_type for r in here)]
    for r in here:
        for o in r.output:
            rest = _path_ahead(readers, o, depth - 1)
            if rest is not None:
                return ["+".join(x.op_type for x in here)] + rest
    return None


def census(model: onnx.ModelProto) -> list[Core]:
    """Every Softmax of the main graph between two MatMuls, with its form."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, list] = collections.defaultdict(list)
    for n in g.node:
        for t in n.input:
            readers[t].append(n)
    found = []
    for n in g.node:
        if n.op_type != "Softmax" or n.domain not in ("", "ai.onnx"):
            continue
        back, ahead = _path_back(producer, n.input[0], BACK), _path_ahead(readers, n.output[0], AHEAD)
        if back is not None and ahead is not None:
            found.append(Core(n.name or n.output[0], " > ".join(back + ["Softmax"] + ahead)))
    return found


def survey(path: Path, shapes: dict, verify: bool) -> ModelForms:
    """The census of one model against optimize's report."""
    out = ModelForms(path.stem, census(onnx.load(str(path))))
    report = onnxstitch.optimize(str(path), shapes=shapes, verify=verify).report
    chains = [grp for grp in report.plan.groups if grp.scheme == "attention"]
    out.kernels = len(chains)
    in_kernels = {label.rsplit(" (", 1)[0] for grp in chains for label in grp.labels if label.endswith("(Softmax)")}
    for core in out.cores:
        named = [r for r in report.attention_refusals if f"attention at '{core.softmax}'" in r]
        if core.softmax in in_kernels:
            core.status = "kernel"
        elif named:
            core.status, core.why = "refused", named[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="corpus model names (default: every transformers model)")
    ap.add_argument("--corpus", type=Path, default=ROOT / "build" / "corpus")
    ap.add_argument("--json", type=Path, help="write the survey here")
    ap.add_argument("--verify", action="store_true", help="verify on ONNX Runtime inside optimize")
    ap.add_argument("-v", "--verbose", action="store_true", help="each Softmax with its status")
    ap.add_argument("--forms", action="store_true", help="the forms met, with their counts")
    args = ap.parse_args()
    manifest = args.corpus / "manifest.json"
    if not manifest.exists():
        print(f"{manifest}: not found (scripts/build_corpus.py builds the corpus)", file=sys.stderr)
        return 2
    entries = {m["name"]: m for m in json.loads(manifest.read_text())["models"]}
    names = args.models or sorted(n for n, m in entries.items() if m.get("source", "").startswith("transformers"))
    unknown = [n for n in names if n not in entries]
    if unknown:
        print(f"not in {manifest}: {', '.join(unknown)}", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    results = []
    print(f"{'model':26s} {'cores':>5s} {'kernels':>7s} {'refused':>7s} {'unaccounted':>11s}")
    for name in names:
        r = survey(args.corpus / entries[name]["file"], entries[name].get("shapes", {}), args.verify)
        results.append(r)
        print(f"{name:26s} {len(r.cores):5d} {r.count('kernel'):7d} {r.count('refused'):7d} {r.count('unaccounted'):11d}",
              flush=True)
        if args.forms:
            for form, k in collections.Counter(c.form for c in r.cores).items():
                print(f"    {k:3d} × {form}")
        if args.verbose:
            for c in r.cores:
                print(f"    {c.status:11s} {c.softmax}{': ' + c.why if c.why else ''}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"kernels": r.kernels} for r in results], indent=1))
    return 1 if any(r.count("unaccounted") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
