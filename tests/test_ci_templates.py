"""The CI templates (examples/ci/github-workflow.yml, examples/ci/gitlab-ci.yml) work when copied into
another repository: they install dpfl-audit by this version, read nothing of this repository (no
examples/, .ci/, tests/, no editable install), every dpfl-audit command in them is one the command
line accepts, and their shell steps, run in a folder that holds only a user's policy and audit
config, audit and gate."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import audit
from audit.cli_parser import build_parser
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / "examples" / "ci" / "github-workflow.yml"
GITLAB = ROOT / "examples" / "ci" / "gitlab-ci.yml"
#: what a copied template cannot find in another repository
REPO_LOCAL = re.compile(r"(?<![\w.-])(examples/|\.ci/|tests/|benchmarks/)|pip install (-e )?\.(\s|$|\[)")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def _github() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(environment, [(step name, shell script), ...]) of the workflow's run steps, in order."""
    workflow = yaml.safe_load(GITHUB.read_text(encoding="utf-8"))
    env = dict(workflow.get("env", {}))
    scripts = []
    for job in workflow["jobs"].values():
        env.update(job.get("env", {}))
        scripts += [(step.get("name", ""), step["run"]) for step in job["steps"] if "run" in step]
    return env, scripts


def _gitlab() -> tuple[dict[str, str], list[tuple[str, str]]]:
    pipeline = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    env = dict(pipeline.get("variables", {}))
    scripts = []
    for name, job in pipeline.items():
        if isinstance(job, dict) and "script" in job:
            env.update(job.get("variables", {}))
            for part in ("before_script", "script", "after_script"):
                scripts += [(f"{name}.{part}", item) for item in job.get(part, [])]
    return env, scripts


TEMPLATES = {"github": _github, "gitlab": _gitlab}


def _commands(script: str) -> list[str]:
    """The dpfl-audit command lines of a shell script (continuation lines joined, pipes cut off)."""
    lines = script.replace("\\\n", " ").splitlines()
    return [line.strip().split(" | ")[0] for line in lines if re.match(r"\s*dpfl-audit(\s|$)", line)]


def _expanded(command: str, env: dict[str, str], script: str) -> list[str]:
    """The command's words with the template's variables and its bash arrays at their fullest value."""
    arrays = dict(re.findall(r"\b([a-z_]+)=\(([^)]+)\)", script))
    command = re.sub(r'"\$\{([a-z_]+)\[@\]\}"', lambda m: arrays[m.group(1)], command)

    def value(match: re.Match) -> str:
        assert match.group(1) in env, f"{command}: ${match.group(1)} is not set by the template"
        return str(env[match.group(1)])

    return shlex.split(VARIABLE.sub(value, command))


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_template_uses_nothing_of_this_repository(template):
    env, scripts = TEMPLATES[template]()
    assert scripts
    for name, script in scripts:
        assert not REPO_LOCAL.search(script), f"{template}: step {name!r} reads this repository: {script}"
    assert env["POLICY"] == "privacy-policy.yaml" and env["AUDIT_CONFIG"] == "privacy-audit.yaml"


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_template_installs_this_version(template):
    env, scripts = TEMPLATES[template]()
    requirement = Requirement(env["DPFL_AUDIT"])
    assert requirement.name == "dpfl-audit" and str(requirement.specifier) == f"=={audit.__version__}"
    assert any('pip install "$DPFL_AUDIT"' in script for _, script in scripts)
    # the git alternative, in a comment, at this version's tag
    text = (GITHUB if template == "github" else GITLAB).read_text(encoding="utf-8")
    (alternative,) = re.findall(r'DPFL_AUDIT: "(dpfl-audit @ git\+https://[^"]+)"', text)
    assert Requirement(alternative).url.endswith(f"@v{audit.__version__}")
    # CPU PyTorch first, from its own index
    assert any("pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in script
               for _, script in scripts)


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_dpfl_audit_command_parses(template):
    env, scripts = TEMPLATES[template]()
    parser = build_parser()
    seen = []
    for _, script in scripts:
        for command in _commands(script):
            words = _expanded(command, env, script)
            assert words[0] == "dpfl-audit"
            if words[1:] == ["--version"]:
                seen.append("--version")
                continue
            args = parser.parse_args(words[1:])
            seen.append(args.command)
            if args.command == "check":
                assert args.policy == "privacy-policy.yaml" and args.junit and args.baseline == "baseline"
            if args.command == "run":
                assert args.out == "audit-out"
    assert sorted(seen) == ["--version", "check", "run", "run"]  # with the user's audit config and without


def _run_steps(template: str, folder: Path) -> subprocess.CompletedProcess:
    """The template's shell steps in ``folder``, as one bash script, the network's steps left out
    (installing, fetching the baseline from GitHub), dpfl-audit this checkout's."""
    env, scripts = TEMPLATES[template]()
    kept = [script for name, script in scripts
            if "pip install" not in script and not name.startswith("Restore the baseline")]
    summary = folder / "summary.md"
    environment = {**os.environ, **{k: str(v) for k, v in env.items()}, "GITHUB_STEP_SUMMARY": str(summary),
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                   "PYTHONPATH": str(ROOT)}
    for name in ("CI_API_V4_URL", "CI_PROJECT_ID", "CI_DEFAULT_BRANCH", "CI_JOB_NAME", "CI_JOB_TOKEN"):
        environment.pop(name, None)  # no GitLab: the baseline's download fails and is reported as absent
    program = "set -eo pipefail\n" + "\n".join(kept) + "\n"
    return subprocess.run(["bash", "-c", program], cwd=folder, env=environment, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_steps_audit_and_gate_in_another_repository(template, tmp_path):
    """A repository of a user's own: a seconds-long audit config and a policy; no dpfl-audit files."""
    repository = tmp_path / "their-repository"
    repository.mkdir()
    (repository / "privacy-audit.yaml").write_text(tiny_config(), encoding="utf-8")
    policy = ("version: 1\nrules:\n  - kind: no-violation\n  - kind: min\n    name: fedavg learns\n    defense: fedavg\n"
              "    metric: test_accuracy\n    value: 0.01\n")
    (repository / "privacy-policy.yaml").write_text(policy, encoding="utf-8")
    result = _run_steps(template, repository)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (repository / "audit-out" / "results.json").is_file() and (repository / "junit.xml").is_file()
    check = (repository / "check.txt").read_text(encoding="utf-8")
    assert "PASS     fedavg learns" in check and "check passed" in check

    # a policy that fails fails the steps; a repository without a policy stops before the audit
    (repository / "privacy-policy.yaml").write_text(policy.replace("value: 0.01", "value: 0.999"), encoding="utf-8")
    assert _run_steps(template, repository).returncode == 1
    (repository / "privacy-policy.yaml").unlink()
    result = _run_steps(template, repository)
    assert result.returncode == 2 and "no privacy-policy.yaml in the repository" in result.stdout
