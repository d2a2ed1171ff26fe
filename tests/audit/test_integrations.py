"""`dpfl-audit list --json` shows the integrations the installed packages allow."""

import importlib
import json

from audit.cli import main


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


def test_list_json_shows_each_integration_as_available_exactly_when_its_packages_import(capsys):
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    details = listing["details"]["integrations"]
    assert {"checkpoints", "own-training", "opacus", "score-files", "flower"} <= set(details)
    for name, entry in details.items():
        needed = {"opacus": ["opacus"], "flower": ["flwr"], "checkpoints": ["safetensors"]}.get(name, [])
        assert entry["available"] == all(_importable(m) for m in needed), name
        assert (name in listing["integrations"]) == entry["available"]
        assert entry["python"] and (entry["extra"] is None or entry["install"] == INSTALL[entry["extra"]])


#: what each extra installs, as pyproject.toml declares it: the hint names the packages, which pip
#: finds whether dpfl-audit came from an index, a clone or a wheel
INSTALL = {"opacus": "pip install 'opacus>=1.4'", "flower": "pip install 'flwr[simulation]>=1.42'",
           "parquet": "pip install 'pyarrow>=14'"}


def test_an_integration_whose_package_is_missing_is_listed_as_not_installed(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a))
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "flower" not in listing["integrations"]
    assert listing["details"]["integrations"]["flower"]["available"] is False
    assert listing["details"]["integrations"]["flower"]["packages"] == {"flwr": None}
