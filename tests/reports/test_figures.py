"""Figure files: the report's plots as PNG and PDF in figures/."""

from __future__ import annotations

import struct
from pathlib import Path

import matplotlib.image

from audit.cli import main
from tests.helpers import tiny_config


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])  # IHDR: width, height


def test_an_audit_writes_every_figure_as_png_and_pdf_and_report_regenerates_them(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(tiny_config(defenses=[{"name": "fedavg"}, {"name": "dp-fedavg", "epsilons": [2.0, 8.0]}],
                                  attacks=[{"name": "loss-threshold"}, {"name": "record-canaries", "params": {"canaries": 20}}]))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 0
    figures = out / "figures"
    stems = {p.stem for p in figures.iterdir()}
    assert {"privacy-utility", "leakage-auc", "claimed-vs-measured", "roc-loss-threshold", "roc-record-canaries"} <= stems
    for stem in stems:  # every figure in both formats
        png, pdf = figures / f"{stem}.png", figures / f"{stem}.pdf"
        width, height = _png_size(png)
        assert width >= 300 and height >= 250, (stem, width, height)
        image = matplotlib.image.imread(png)  # decodes: a real image, not just a header
        assert image.shape[:2] == (height, width) and image.std() > 0.01  # not a blank page
        data = pdf.read_bytes()
        assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF") and len(data) > 2000, stem
        assert b"/Type /Page" in data
    before = {p.name: p.read_bytes() for p in figures.iterdir()}
    for path in figures.iterdir():
        path.unlink()
    assert main(["report", str(out), "--figures"]) == 0
    assert "figures: " in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == before  # same results, same bytes


def test_an_external_audit_writes_figures_too(tmp_path, capsys):
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "scores-out"
    assert main(["scores", str(root / "examples" / "scores" / "lira-fedavg.csv"), "--out", str(out)]) == 0
    names = {p.name for p in (out / "figures").iterdir()}
    assert {"roc-membership-scores.png", "roc-membership-scores.pdf"} <= names, names
