"""Plan pictures (onnxstitch/explain): the report's graph outline against the model it came from,
and the SVG read back with xml.etree: every fused group one labelled box with its scheme and
ops, every edge between existing boxes and every model edge drawn, no two boxes overlapping,
repeated layers collapsed into one box that states their count."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP, helper, numpy_helper

from onnxstitch.cli.main import main
from onnxstitch import explain, optimize
from onnxstitch.explain.outline import scope_of

from .corpus import CORPUS

SVG = "{http://www.w3.org/2000/svg}"
HIDDEN = 32


def layered_model(layers: int = 5, seq: int = 16) -> onnx.ModelProto:
    """`layers` identical blocks named like a TorchScript export (/layers.K/...): MatMul, then
    bias, Relu, residual Add and LayerNormalization (one rows group per layer; the residual Add
    of the next layer is refused to the group before it, which would close a cycle)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    cur = "x"
    for k in range(layers):
        p = f"/layers.{k}"
        inits += [numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), f"b{k}"),
                  numpy_helper.from_array(np.ones(HIDDEN, np.float32), f"g{k}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{k}"], [f"m{k}"], name=f"{p}/dense/MatMul"),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"], name=f"{p}/dense/Add"),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}"], name=f"{p}/act/Relu"),
                  helper.make_node("Add", [f"r{k}", cur], [f"s{k}"], name=f"{p}/Add"),
                  helper.make_node("LayerNormalization", [f"s{k}", f"g{k}"], [f"h{k}"], name=f"{p}/norm/LayerNorm",
                                   axis=-1)]
        cur = f"h{k}"
    # A head ONNX Runtime runs, so that the last layer is planned like the others.
    inits.append(numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "wh"))
    nodes += [helper.make_node("MatMul", [cur, "wh"], ["o"], name="/head/MatMul"),
              helper.make_node("Sigmoid", ["o"], ["y"], name="/head/Sigmoid")]
    graph = helper.make_graph(nodes, "layered", [helper.make_tensor_value_info("x", TP.FLOAT, [seq, HIDDEN])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [seq, HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.fixture(scope="module")
def small_report() -> dict:
    return optimize(layered_model(), verify=False).report.to_json()


# ---------------------------------------------------------------------------------------------
# Reading the SVG back.


@dataclass(frozen=True)
class Drawn:
    """One box as the SVG has it."""

    id: str
    kind: str
    x: float
    y: float
    w: float
    h: float
    text: str  # its visible lines, joined
    tooltip: str
    attrs: dict

    @property
    def nodes(self) -> set[int]:
        return {int(i) for i in self.attrs.get("data-nodes", "").split()}


def read_svg(text: str) -> tuple[list[Drawn], list[ET.Element], ET.Element]:
    root = ET.fromstring(text)
    boxes = []
    for g in root.iter(f"{SVG}g"):
        if not g.get("class", "").startswith("unit "):
            continue
        r = g.find(f"{SVG}rect")
        lines = [t.text or "" for t in g.iter(f"{SVG}text")]
        boxes.append(Drawn(g.get("id"), g.get("data-kind"), float(r.get("x")), float(r.get("y")),
                           float(r.get("width")), float(r.get("height")), "\n".join(lines),
                           g.find(f"{SVG}title").text or "", dict(g.attrib)))
    edges = [p for p in root.iter(f"{SVG}path") if p.get("class", "").startswith("edge")]
    return boxes, edges, root


def _ops_of(group: dict) -> list[str]:
    """Op types from the report's own labels, "name (Op)"."""
    return [re.fullmatch(r".* \((\w+)\)", label)[1] for label in group["labels"]]


def check_picture(svg_text: str, report: dict) -> list[Drawn]:
    """The properties every picture has; returns its boxes."""
    boxes, edges, _ = read_svg(svg_text)
    by_id = {b.id: b for b in boxes}
    assert len(by_id) == len(boxes)
    # No two boxes overlap.
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
            assert apart, f"{a.id} {a.text.splitlines()[0]!r} overlaps {b.id} {b.text.splitlines()[0]!r}"
    # Each node is drawn at most once; every fused group's nodes are drawn.
    owner: dict[int, str] = {}
    for b in boxes:
        for i in b.nodes:
            assert i not in owner, f"node {i} drawn in {owner[i]} and {b.id}"
            owner[i] = b.id
    groups = report["plan"]["groups"]
    layers = [b for b in boxes if b.kind == "layers"]
    for grp in groups:
        assert all(i in owner for i in grp["nodes"]), grp["name"]
        home = by_id[owner[grp["nodes"][0]]]
        assert {owner[i] for i in grp["nodes"]} == {home.id}, f"{grp['name']} split over boxes"
        if home.kind == "layers":
            continue
        # One labelled shape: its name, scheme and every op type; node names in the tooltip.
        assert home.kind == "group" and home.attrs["data-name"] == grp["name"]
        assert home.attrs["data-scheme"] == grp["scheme"] and grp["scheme"] in home.text
        assert set(home.nodes) == set(grp["nodes"])
        for op in _ops_of(grp):
            assert op in home.text, f"{grp['name']}: {op} not shown"
        for label in grp["labels"]:
            assert label.rsplit(" (", 1)[0] in home.tooltip
    # A collapsed box states its count and the fused groups it holds.
    for b in layers:
        count = int(b.attrs["data-count"])
        assert f"× {count} identical layers" in b.text
        inside = sum(1 for grp in groups if owner[grp["nodes"][0]] == b.id and "dropped_by_verification" not in grp)
        assert re.search(rf"^{inside} fused groups?\b", b.text, re.M), b.text
    # Every edge joins existing boxes, from the bottom of one to the top of the other.
    drawn = set()
    for e in edges:
        src, dst = by_id[e.get("data-from")], by_id[e.get("data-to")]
        pts = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", e.get("d"))]
        (x0, y0), (x1, y1) = pts[:2], pts[-2:]
        assert src.x <= x0 <= src.x + src.w and y0 in (pytest.approx(src.y + src.h), pytest.approx(src.y))
        assert dst.x <= x1 <= dst.x + dst.w and y1 in (pytest.approx(dst.y), pytest.approx(dst.y + dst.h))
        drawn.add(frozenset((src.id, dst.id)))
    # ... and every edge of the model between two drawn boxes is drawn.
    for a, b in report["graph"]["edges"]:
        if a in owner and b in owner and owner[a] != owner[b]:
            assert frozenset((owner[a], owner[b])) in drawn, f"edge {a}->{b} missing"
    return boxes


# ---------------------------------------------------------------------------------------------
# The report's outline.


def test_report_graph_outline_is_the_models_graph(small_report: dict) -> None:
    model = layered_model()
    out = small_report["graph"]
    assert [(n["name"], n["op"]) for n in out["nodes"]] == [(n.name, n.op_type) for n in model.graph.node]
    producer = {t: i for i, n in enumerate(model.graph.node) for t in n.output}
    expected = {(producer[t], i) for i, n in enumerate(model.graph.node) for t in n.input if t in producer}
    assert {tuple(e) for e in out["edges"]} == expected
    assert out["outputs"] == [len(model.graph.node) - 1]
    assert [n["scope"] for n in out["nodes"][:2]] == ["layers/0/dense", "layers/0/dense"]
    assert {n["op"] for n in out["nodes"] if n["ort_reason"]} == {"MatMul"}
    for grp in small_report["plan"]["groups"]:
        assert [f"{out['nodes'][i]['name']} ({out['nodes'][i]['op']})" for i in grp["nodes"]] == grp["labels"]


def test_scope_from_dynamo_metadata_and_from_torchscript_names() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"], name="node_add_3")
    assert scope_of(node) == ""
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", "['', 'encoder', 'encoder.layer.1', 'encoder.layer.1.out', 'add_3']"
    assert scope_of(node) == "encoder/layer/1/out"
    assert scope_of(helper.make_node("Relu", ["a"], ["b"], name="/model/encoder/layer.0/act/Relu")) == \
        "model/encoder/layer/0/act"


# ---------------------------------------------------------------------------------------------
# Pictures.


def test_small_model_picture_shows_groups_refusals_and_edges(small_report: dict) -> None:
    svg = explain.render(small_report, "svg", "layered", max_whole=1000)
    boxes = check_picture(svg, small_report)
    assert not [b for b in boxes if b.kind == "layers"]
    groups = small_report["plan"]["groups"]
    assert len([b for b in boxes if b.kind == "group"]) == len(groups) >= 5
    # The residual Add the group before could not take: named in its box, the edge dashed red.
    refused = [(g["name"], r) for g in groups for r in g["left_out"]
               if small_report["graph"]["nodes"][r["node"]]["ort_reason"] is None]
    assert refused
    _, edges, _ = read_svg(svg)
    red = [e for e in edges if "refused" in e.get("class")]
    by_name = {b.attrs.get("data-name"): b for b in boxes}
    for name, r in refused:
        neighbour = small_report["graph"]["nodes"][r["node"]]["name"]
        assert f"{neighbour} (Add) left out" in " ".join(by_name[name].text.split())
        assert r["reason"] in by_name[name].tooltip
        assert any(e.get("data-from") == by_name[name].id for e in red)


def test_repeated_layers_are_one_box_that_says_how_many(small_report: dict) -> None:
    svg = explain.render(small_report, "svg", "layered", max_whole=0)
    boxes = check_picture(svg, small_report)
    layers = [b for b in boxes if b.kind == "layers"]
    assert len(layers) == 1
    # Layer 0 drawn in full, the other four in the box: counted from the node names.
    indices = {re.match(r"/layers\.(\d+)/", n["name"])[1] for n in small_report["graph"]["nodes"]
               if n["name"].startswith("/layers.")}
    assert layers[0].attrs["data-count"] == str(len(indices) - 1)
    assert "layers.1 … layers.4" in layers[0].text
    first = next(g for g in small_report["plan"]["groups"]
                 if small_report["graph"]["nodes"][g["nodes"][0]]["name"].startswith("/layers.0/"))
    assert any(b.attrs.get("data-name") == first["name"] for b in boxes)


def test_html_is_self_contained(small_report: dict) -> None:
    page = explain.render(small_report, "html", "layered")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert not re.search(r"(src|href)=\"(https?:|//)", page)
    svg = page[page.index("<svg"):page.index("</svg>") + len("</svg>")]
    check_picture(svg, small_report)


def test_cli_plan_picture_and_explain_after_the_fact(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(layered_model(3), src)
    run = CliRunner().invoke(main, ["optimize", str(src), "-o", str(tmp_path / "out.onnx"), "--no-verify", "-q",
                                    "--report", str(tmp_path / "r.json"), "--plan-picture", str(tmp_path / "p.html")])
    assert run.exit_code == 0, run.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert "<svg" in (tmp_path / "p.html").read_text()
    run = CliRunner().invoke(main, ["explain", str(tmp_path / "r.json"), "-o", str(tmp_path / "p.svg")])
    assert run.exit_code == 0, run.output
    check_picture((tmp_path / "p.svg").read_text(), report)


@pytest.mark.parametrize("case", ["suffix", "not json", "old report", "missing"])
def test_explain_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    rep = tmp_path / "r.json"
    rep.write_text({"suffix": '{"plan": {}, "graph": {}}', "not json": "nope", "old report": '{"plan": {}}',
                    "missing": ""}[case])
    if case == "missing":
        rep.unlink()
    out = tmp_path / ("p.png" if case == "suffix" else "p.svg")
    run = CliRunner().invoke(main, ["explain", str(rep), "-o", str(out)])
    assert run.exit_code == 2 and run.output.count("\n") == 1 and "error:" in run.output, run.output
    assert not out.exists()


@pytest.mark.parametrize("name", ["nudenet-320n", "bert-ts"])
def test_corpus_model_picture(name: str) -> None:
    path = CORPUS / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} not built (scripts/build_corpus.py)")
    report = optimize(path, verify=False).report.to_json()
    boxes = check_picture(explain.render(report, "svg", name), report)
    layers = [b for b in boxes if b.kind == "layers"]
    if name == "bert-ts":
        # Encoder layers 1..3 in one box; the count from the node names, independently.
        indices = {m[1] for n in report["graph"]["nodes"] if (m := re.match(r"/model/encoder/layer\.(\d+)/", n["name"]))}
        assert [b.attrs["data-count"] for b in layers] == [str(len(indices) - 1)]


def test_screenshot_in_a_headless_browser(small_report: dict, tmp_path: Path) -> None:
    """Bonus: a real browser draws the page; the schemes' colours are on the screen."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no headless chromium (apt-get install chromium)")
    image = pytest.importorskip("PIL.Image")

    page, shot = tmp_path / "p.html", tmp_path / "p.png"
    page.write_text(explain.render(small_report, "html", "layered", max_whole=1000))
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = {tuple(p) for p in np.asarray(image.open(shot).convert("RGB")).reshape(-1, 3).tolist()}
    assert (0xDC, 0xFC, 0xE7) in pixels  # a rows group's fill
    assert (0xF3, 0xF4, 0xF6) in pixels  # an ONNX Runtime node's fill


def test_a_group_verification_dropped_is_drawn_as_such(small_report: dict) -> None:
    report = json.loads(json.dumps(small_report))
    victim = report["plan"]["groups"][1]
    victim["dropped_by_verification"] = "outputs differ from the original's (max abs err 3.2)"
    boxes = check_picture(explain.render(report, "svg", "dropped", max_whole=1000), report)
    box = next(b for b in boxes if b.attrs.get("data-name") == victim["name"])
    assert "left to ONNX Runtime by verification" in box.text and "max abs err 3.2" in box.tooltip
    assert f"{len(report['plan']['groups']) - 1} fused groups" in explain.render(report, "svg", "dropped")
    # The kernel each kept group runs, in its tooltip.
    kept = next(b for b in boxes if b.attrs.get("data-name") == report["plan"]["groups"][0]["name"])
    assert f"kernel {report['plan']['groups'][0]['kernel']['kernel']}" in kept.tooltip


def test_optimize_refuses_a_picture_it_cannot_write_before_the_work(tmp_path: Path) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(layered_model(2), src)
    run = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--plan-picture", str(tmp_path / "p.png")])
    assert run.exit_code == 2 and ".svg or .html" in run.output and not out.exists()
