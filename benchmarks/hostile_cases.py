"""Hostile output folders, input files and labels, each tried once as a user would, as a table.

Each case builds a fresh folder, runs one ``dpfl-audit`` command in a child process (with a time
limit: a command that hangs on a FIFO shows as ``timeout``), and records its exit code, the first
line of stderr, whether a victim file outside ``--out`` kept its SHA-256, whether a temporary file
of an interrupted write was left behind, and what the case checks beyond that (the value a forged
cache entry would have put in results.json, whether results.csv keeps its columns, whether the
JUnit XML parses). Writes ``results/hostile-cases.json`` and prints a Markdown table.

    python benchmarks/hostile_cases.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "hostile-cases.json"
TINY = """name: tiny
dataset: {name: digits, max_pool: 100, max_test: 50}
partition: {name: iid, clients: 2}
training: {rounds: 1, local_steps: 1, batch_size: 10, lr: 0.05}
defenses: [{name: fedavg}]
membership: {runs: 2}
attacks: [{name: loss-threshold, label: LABEL}]
diagnostics: {enabled: false}
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def cli(args: list[str], cwd: Path, limit_bytes: int | None = None, timeout: int = 300) -> tuple[str, str, str]:
    """(exit code or 'timeout', stdout, stderr) of ``dpfl-audit ARGS`` in a child process."""
    def limits() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    try:
        done = subprocess.run([sys.executable, "-m", "audit", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limits, errors="replace")
    except subprocess.TimeoutExpired:
        return "timeout", "", ""
    return str(done.returncode), done.stdout, done.stderr


def scores_csv(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    path = folder / "s.csv"
    path.write_text("canary,score,inserted\n" + "".join(f"{i},{rng.normal(i % 2):.6f},{i % 2}\n" for i in range(200)),
                    encoding="utf-8")
    return path


def number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def leftovers(out: Path) -> int:
    return sum(1 for p in out.rglob("*") if p.name.endswith((".tmp", ".tmp.npz"))) if out.exists() else 0


def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    from numpy.lib import format as npy

    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npz(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


# --------------------------------------------------------------------------- the cases: (folder, victim) -> (args, check)


def entry(name: str, kind: str) -> Callable:
    def case(folder: Path, victim: Path):
        out = folder / "out"
        out.mkdir()
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        {"hardlink": lambda: os.link(victim, path), "fifo": lambda: os.mkfifo(path), "folder": path.mkdir,
         "file": lambda: path.write_text("x")}[kind]()
        return ["scores", str(scores_csv(folder)), "--out", str(out)], None
    return case


def sparse_report(folder: Path, victim: Path):
    out = folder / "out"
    cli(["scores", str(scores_csv(folder)), "--out", str(out)], folder)
    with open(out / "report.html", "r+b") as handle:
        handle.truncate(20 * 2**30)
    args = ["scores", str(scores_csv(folder)), "--out", str(out)]
    return args, lambda o, e: f"report.html {os.path.getsize(out / 'report.html')} bytes"


def full_disk(folder: Path, victim: Path):
    return ["scores", str(scores_csv(folder)), "--out", str(folder / "out")], None


def trained(folder: Path, label: str = "loss-threshold") -> tuple[Path, Path]:
    config = folder / "tiny.yaml"
    config.write_text(TINY.replace("LABEL", json.dumps(label)), encoding="utf-8")
    out = folder / "out"
    cli(["run", str(config), "--out", str(out), "--quiet"], folder)
    return config, out


def auc_of(out: Path) -> float:
    document = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return document["experiments"][0]["attacks"][0]["metrics"]["auc"]["value"]


def forged_cache(folder: Path, victim: Path):
    config, out = trained(folder)
    real = auc_of(out)
    entry_file = next((out / "cache" / "attacks").rglob("*.json"))
    document = json.loads(entry_file.read_text())
    document["value"]["results"][0]["fields"]["metrics"]["auc"]["fields"]["value"] = 0.5
    body = {k: document[k] for k in ("key", "outputs", "reads", "value")}
    digest = hashlib.sha256(json.dumps(body, ensure_ascii=False, allow_nan=False).encode()).hexdigest()
    document["seal" if "seal" in document else "digest"] = digest
    entry_file.write_text(json.dumps(document))
    args = ["run", str(config), "--out", str(out), "--quiet"]
    return args, lambda o, e: f"AUC reported {auc_of(out):.4f} (real {real:.4f}, forged 0.5)"


def run_file_edited(name: str) -> Callable:
    def case(folder: Path, victim: Path):
        config, out = trained(folder)
        run = next(p for p in sorted((out / "runs").iterdir()) if p.is_dir())
        if name == "membership.npy":
            np.save(run / name, np.load(run / name)[::-1].copy(), allow_pickle=False)
        else:
            data = bytearray((run / name).read_bytes())
            data[-1] ^= 1
            (run / name).write_bytes(bytes(data))
        return ["run", str(config), "--out", str(out), "--quiet"], None
    return case


def bomb(kind: str) -> Callable:
    def case(folder: Path, victim: Path):
        if kind == "npz-text":
            file = npz(folder / "b.npz", {"canary.npy": npy_header((2_000_000,), "<U1024"),
                                          "score.npy": npy_header((2_000_000,), "<f8"),
                                          "inserted.npy": npy_header((2_000_000,), "<i8")})
        elif kind == "npz-columns":
            file = npz(folder / "b.npz", {f"c{i}.npy": npy_header((10_000_000,), "<f8") for i in range(64)})
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            rows = 2_000_000
            canary = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), pa.array(["u" * 4000]))
            file = folder / "b.parquet"
            pq.write_table(pa.table({"canary": canary, "score": np.zeros(rows), "inserted": np.zeros(rows, dtype=np.int64)}),
                           file)
        return ["scores", str(file), "--out", str(folder / "out")], None
    return case


def plugin_attack(folder: Path, victim: Path):
    (folder / "wrong.py").write_text("class Thing:\n    kind = 'membership'\n")
    config = folder / "c.yaml"
    config.write_text(TINY.replace("loss-threshold, label: LABEL", f"{folder / 'wrong.py'}:Thing"), encoding="utf-8")
    return ["run", str(config), "--out", str(folder / "out"), "--quiet"], None


def csv_label(folder: Path, victim: Path):
    def check(o: str, e: str) -> str:
        with (folder / "out" / "results.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        columns = {len(row) for row in rows}
        live = [c for row in rows[1:] for c in row if c.startswith(("=", "+", "-", "@")) and not number(c)]
        return f"rows {len(rows)}, column counts {sorted(columns)}, live formulas {len(live)}"
    return ["scores", str(scores_csv(folder)), "--name=\r=1+1", "--out", str(folder / "out")], check


def junit_control(folder: Path, victim: Path):
    out = folder / "out"
    cli(["scores", str(scores_csv(folder)), "--name=a\x1bb\x01", "--out", str(out)], folder)
    policy = folder / "p.yaml"
    policy.write_text('rules:\n  - {name: "esc \\e one \\x01", kind: no-violation}\n', encoding="utf-8")

    def check(o: str, e: str) -> str:
        ET.parse(out / "junit.xml")
        return "junit.xml parses"
    return ["check", str(out), "--policy", str(policy), "--junit", str(out / "junit.xml")], check


def nul_rule(folder: Path, victim: Path):
    out = folder / "out"
    cli(["scores", str(scores_csv(folder)), "--out", str(out)], folder)
    policy = folder / "p.yaml"
    policy.write_text('rules:\n  - {name: "a\\0b", kind: no-violation}\n', encoding="utf-8")
    return ["check", str(out), "--policy", str(policy)], None


def terminal(folder: Path, victim: Path):
    def check(o: str, e: str) -> str:
        raw = sum(o.count(c) + e.count(c) for c in ("\x1b", "\x07", "\r", "\u202e"))
        log = (folder / "out" / "run.log").read_text(encoding="utf-8")
        page = (folder / "out" / "report.html").read_text(encoding="utf-8")
        raw_files = sum(t.count(c) for t in (log, page) for c in ("\x1b", "\x07", "\u202e"))
        return f"raw control characters: terminal {raw}, run.log + report.html {raw_files}"
    return ["scores", str(scores_csv(folder)), "--name=\x1b[2K\x1b]0;title\x07\u202eevil", "--out", str(folder / "out"),
            "-v"], check


def long_label(folder: Path, victim: Path):
    config = folder / "c.yaml"
    config.write_text(TINY.replace("LABEL", "A" * 100_000), encoding="utf-8")
    return ["run", str(config), "--out", str(folder / "out"), "--quiet"], None


def edited_results(how: str) -> Callable:
    def case(folder: Path, victim: Path):
        out = folder / "out"
        cli(["scores", str(scores_csv(folder)), "--out", str(out)], folder)
        text = (out / "results.json").read_text(encoding="utf-8")
        if how == "auc":
            document = json.loads(text)
            document["experiments"][0]["attacks"][0]["metrics"]["auc"]["value"] = 7.5
            text = json.dumps(document)
        else:
            text = text.replace('"schema_version"', '"experiments": [], "schema_version"', 1)
        (out / "results.json").write_text(text, encoding="utf-8")
        return ["report", str(out)], None
    return case


CASES: dict[str, tuple[str, Callable, dict]] = {
    "1 hard link at the lock": ("scores", entry(".dpfl-audit.lock", "hardlink"), {}),
    "1 hard link at run.log": ("scores", entry("run.log", "hardlink"), {}),
    "2 FIFO at report.html": ("scores", entry("report.html", "fifo"), {}),
    "2 FIFO at results.csv": ("scores", entry("results.csv", "fifo"), {}),
    "2 FIFO at run.log": ("scores", entry("run.log", "fifo"), {}),
    "2 FIFO at the lock": ("scores", entry(".dpfl-audit.lock", "fifo"), {}),
    "2 FIFO at a cache entry": ("scores", entry("cache/attacks/x/loss-threshold.json", "fifo"), {}),
    "3 run.log a folder": ("scores", entry("run.log", "folder"), {}),
    "3 results.json a folder": ("scores", entry("results.json", "folder"), {}),
    "3 figures a file": ("scores", entry("figures", "file"), {}),
    "3 cache a file": ("scores", entry("cache", "file"), {}),
    "3 a cache entry a folder": ("scores", entry("cache/attacks/x/loss-threshold.json", "folder"), {}),
    "3 report.html sparse 20 GB": ("scores", sparse_report, {}),
    "3 disk full (RLIMIT_FSIZE 20 kB)": ("scores", full_disk, {"limit_bytes": 20_000}),
    "4 NPZ <U1024 × 2 M rows": ("scores", bomb("npz-text"), {}),
    "4 NPZ 64 × 10 M float64": ("scores", bomb("npz-columns"), {}),
    "4 Parquet dictionary → 8 GB": ("scores", bomb("parquet"), {}),
    "5 forged cache entry, digest recomputed": ("run", forged_cache, {}),
    "5 flipped byte in model.safetensors": ("run", run_file_edited("model.safetensors"), {}),
    "5 edited membership.npy": ("run", run_file_edited("membership.npy"), {}),
    "6 plugin attack not an Attack": ("run", plugin_attack, {}),
    "7 label \\r=1+1 in results.csv": ("scores", csv_label, {}),
    "8 control characters in JUnit": ("check", junit_control, {}),
    "8 NUL in a rule name": ("check", nul_rule, {}),
    "9 terminal escapes in a label": ("scores", terminal, {}),
    "10 100,000-character label": ("run", long_label, {}),
    "11 auc.value 7.5 in results.json": ("report", edited_results("auc"), {}),
    "11 duplicate key in results.json": ("report", edited_results("duplicate"), {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only the cases whose name contains one of these")
    args = parser.parse_args()
    rows = []
    for name, (command, build, options) in CASES.items():
        if args.only and not any(part in name for part in args.only):
            continue
        folder = Path(tempfile.mkdtemp(prefix="dpfl-hostile-"))
        try:
            victim = folder / "victim.txt"
            victim.write_text("the victim's bytes\n", encoding="utf-8")
            before = sha(victim)
            argv, check = build(folder, victim)
            code, out, err = cli(argv, folder, **options)
            lines = err.strip().splitlines()
            row = {"case": name, "command": command, "exit": code, "stderr lines": len(lines),
                   "stderr": (lines[0] if lines else "")[:160], "victim unchanged": sha(victim) == before,
                   "temporary files left": leftovers(folder / "out"), "checked": check(out, err) if check else ""}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        rows.append(row)
        print(f"| {row['case']} | {row['exit']} | {row['stderr lines']} | {row['stderr'].replace('|', '/')} | "
              f"{'yes' if row['victim unchanged'] else 'NO'} | {row['temporary files left']} | {row['checked']} |", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
