"""The audit configuration: its schema (dataclasses), presets and YAML loading.

The dataclass defaults *are* the default audit (``dpfl-audit run`` with no config): digits,
20 iid clients, ``fedavg`` and ``dp-fedavg`` at ε ∈ {1, 8}, LiRA over 16 runs. A preset is a
YAML file of overrides in ``audit/presets``; a user's config file is merged over its preset
(``preset: NAME`` in the file or ``--preset`` on the command line; mappings merge key by key,
lists are replaced, and a section naming another component — ``model: {name: cnn-tiny}`` — starts
that component from its own defaults), then ``--set PATH=VALUE`` assignments. ``dpfl-audit
config`` prints the resolved configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from audit.core.errors import UserInputError
from audit.core.schema import MAX_LABEL, from_mapping, to_mapping
from audit.core.strict_yaml import parse_yaml, read_yaml_file
from defenses.federated.training_job import TrainingConfig

#: upper bounds of the config's sizes: far above any audit this tool is for, low enough that a
#: typo (1e30 rounds) is refused before anything is allocated; the plan's estimate does the rest
MAX_CLIENTS = 100_000
MAX_RUNS = 4096
#: ε beyond this is no privacy claim worth auditing (and calibration would hit the noise floor)
MAX_EPSILON = 1000.0
#: ε below this is no target either: calibration would need astronomically large noise, and a
#: denormal like 5e-324 is a typo (it printed as 4.94066e-324 in folder names)
MIN_EPSILON = 1e-6


@dataclass(frozen=True)
class DatasetConfig:
    name: str = field(default="digits", metadata={"help": "registry name (see `dpfl-audit list`) or module:callable"})
    root: str | None = field(default=None, metadata={"help": "directory (or file) holding the data; default "
                                                             "$DPFL_AUDIT_DATA/<name> or ~/.cache/dpfl-audit/data/<name>"})
    options: dict = field(default_factory=dict,
                          metadata={"help": "loader options, e.g. {split: letters} for emnist, {download: false}"})
    test_fraction: float = field(default=0.2, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True, "max_exclusive": True,
                                                        "help": "held-out share when the dataset has no official test split"})
    max_pool: int | None = field(default=None, metadata={"min": 2, "max": 10**9, "help": "cap the candidate pool at this many "
                                                                                         "records (stratified sample)"})
    max_test: int | None = field(default=None,
                                 metadata={"min": 1, "max": 10**9, "help": "cap the test split at this many records"})


@dataclass(frozen=True)
class PartitionConfig:
    name: Literal["iid", "dirichlet", "shards"] = field(default="iid",
                                                        metadata={"help": "how a run's records are split into clients"})
    clients: int = field(default=20, metadata={"min": 1, "max": MAX_CLIENTS, "help": "number of clients N"})
    alpha: float = field(default=0.5,
                         metadata={"min": 0.0, "min_exclusive": True, "max": 1e6, "help": "Dirichlet concentration (dirichlet)"})
    classes_per_client: int = field(default=2, metadata={"min": 1, "max": 10_000, "help": "shards per client (shards)"})
    min_client_size: int = field(default=1, metadata={"min": 1, "max": 10**9, "help": "smallest client allowed"})


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(default="mlp", metadata={"help": "registry name or module:callable(input_shape, num_classes, **options)"})
    options: dict = field(default_factory=lambda: {"hidden": [128]},
                          metadata={"help": "factory options, e.g. {hidden: [128]} for mlp"})


@dataclass(frozen=True)
class DefenseEntry:
    name: str = field(metadata={"help": "registry name or module:callable returning a Defense class"})
    label: str | None = field(default=None, metadata={
        "help": "display name in the report (default: the registered name; for a 'module:Class' reference, the class's own "
                "`name` or its Python name)", "max_chars": MAX_LABEL})
    params: dict = field(default_factory=dict, metadata={"help": "the defense's hyper-parameters (see `dpfl-audit list`)"})
    epsilons: list[float] | None = field(default=None, metadata={"min": MIN_EPSILON, "max": MAX_EPSILON,
                                                                 "min_length": 1, "max_length": 100,
                                                                 "help": "calibrate the noise to each target ε "
                                                                         "(one experiment per ε)"})
    delta: float = field(default=1e-5, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True, "max_exclusive": True})
    training: dict = field(default_factory=dict, metadata={"help": "overrides of the training section for this defense"})


@dataclass(frozen=True)
class MembershipConfig:
    runs: int = field(default=16, metadata={"min": 2, "max": MAX_RUNS,
                                            "help": "runs N; each includes every pool record with probability `inclusion`"})
    inclusion: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0, "min_exclusive": True, "max_exclusive": True})
    unit: Literal["auto", "record", "client"] = field(default="auto", metadata={
        "help": "what a run includes at random: records, or whole clients (auto: client when a defense claims client-level DP)"})
    relation: Literal["auto", "add-remove", "replace-one", "zero-out"] = field(default="auto", metadata={
        "help": "neighbouring datasets the design compares: one unit added or removed (independent coins), one client of a "
                "fixed pair replaced by the other, or one client's data zeroed (client unit); auto: the relation of the "
                "defenses' client-level claims when they agree, else add-remove"})


@dataclass(frozen=True)
class AttackEntry:
    name: str = field(metadata={"help": "registry name (see `dpfl-audit list`)"})
    params: dict = field(default_factory=dict)
    label: str | None = field(default=None, metadata={"help": "name in the report (default: the attack's name)",
                                                      "max_chars": MAX_LABEL})


@dataclass(frozen=True)
class RecordConfig:
    global_rounds: Literal["none", "final", "all"] | list[int] = field(
        default="final", metadata={"min": 1, "help": "rounds whose global model each run stores"})
    upload_rounds: Literal["none", "final", "all"] | list[int] = field(
        default="none", metadata={"min": 1, "help": "rounds whose uploads (server view) each run stores"})
    upload_clients: Literal["all"] | list[int] = field(default="all",
                                                       metadata={"min": 0, "help": "clients whose uploads are stored"})


@dataclass(frozen=True)
class AccountingConfig:
    accountant: Literal["rdp", "pld"] = field(default="rdp", metadata={"help": "dp-accounting's RDP or PLD accountant"})
    conversion: Literal["improved", "classic"] = field(
        default="improved", metadata={"help": "RDP→(ε,δ): improved (Balle et al. 2020) or classic (Mironov 2017)"})


@dataclass(frozen=True)
class DiagnosticsConfig:
    enabled: bool = field(default=True, metadata={"help": "compute loss-landscape diagnostics of every trained run"})
    # at least one radius and one std: the report's diagnostics table has a column for each
    sharpness_radii: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2], metadata={
        "min_length": 1, "min": 0.0, "min_exclusive": True, "max": 100.0,
        "help": "radii along filter-normalised random directions (Li et al. 2018)"})
    sharpness_directions: int = field(default=4, metadata={"min": 1, "max": 1000})
    perturbation_stds: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02], metadata={
        "min_length": 1, "min": 0.0, "min_exclusive": True, "max": 100.0, "help": "std s of the weight perturbation N(0, s²I)"})
    perturbation_repeats: int = field(default=3, metadata={"min": 1, "max": 1000})
    max_records: int = field(default=1000,
                             metadata={"min": 1, "max": 10**7, "help": "records of the training/test data evaluated"})


def _default_training() -> TrainingConfig:
    return TrainingConfig(rounds=60, local_unit="epochs", local_steps=3, batch_size=10, lr=0.05, momentum=0.9)


def _default_defenses() -> list[DefenseEntry]:
    # ε ∈ {1, 4}: what 10⁵ Dirac canary coins can decide (≥ 80 % power against 2ε). At ε = 8 the
    # one-run count bound cannot certify more than ≈ 5 at δ = 10⁻⁵; the all-iterates counts held to
    # the mechanism's own curve can (benchmarks/dirac_own_curve.py, 10⁵ coins, 10 rounds, 10 seeds:
    # honest 0.66–0.68 of its exact 7.44, halved noise VIOLATION in 10 of 10). The default stays at
    # two configurations for its time budget: the preset epsilon-8 is that design, and
    # --set 'defenses.1.epsilons=[1, 4, 8]' adds ε = 8 here
    return [DefenseEntry("fedavg"), DefenseEntry("dp-fedavg", epsilons=[1.0, 4.0])]


def _default_attacks() -> list[AttackEntry]:
    return [AttackEntry("lira"), AttackEntry("rmia"), AttackEntry("shokri"), AttackEntry("loss-threshold"),
            AttackEntry("record-canaries"),
            AttackEntry("client-canaries"), AttackEntry("dirac-canaries"), AttackEntry("gradient-inversion"),
            AttackEntry("attribute-inference")]


@dataclass(frozen=True)
class AuditConfig:
    name: str = field(default="dpfl-audit", metadata={"help": "shown in the report", "max_chars": MAX_LABEL})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**64 - 1, "help": "root of every random choice"})
    device: str = field(default="cpu", metadata={"help": "torch device: cpu, cuda, cuda:1, ..."})
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=_default_training)
    defenses: list[DefenseEntry] = field(default_factory=_default_defenses)
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    attacks: list[AttackEntry] = field(default_factory=_default_attacks)
    record: RecordConfig = field(default_factory=RecordConfig)
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)


# --------------------------------------------------------------------------- presets and loading


def preset_names() -> list[str]:
    folder = resources.files("audit") / "presets"
    return sorted(["default"] + [p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")])


def _mapping(data: Any, source: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: the configuration must be a mapping of fields, got {type(data).__name__}")
    return data


def preset(name: str) -> dict[str, Any]:
    """The overrides of preset ``name`` (``default`` has none)."""
    if name == "default":
        return {}
    if name not in preset_names():
        raise UserInputError(f"preset: unknown preset '{name}'; allowed: {', '.join(preset_names())}")
    text = (resources.files("audit") / "presets" / f"{name}.yaml").read_text(encoding="utf-8")
    return _mapping(parse_yaml(text, f"preset {name}"), f"preset {name}")


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; everything else (lists included) is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


#: component sections and the fields that belong to the component a section names (its files, its
#: options): naming another component starts it from its own defaults, so these are dropped — the
#: previous model's ``hidden: [128]`` is no option of ``cnn-tiny``
COMPONENT_FIELDS: dict[str, tuple[str, ...]] = {"dataset": ("root", "options"), "model": ("options",),
                                                "partition": ("alpha", "classes_per_client")}
#: fields of a defense or attack entry that belong to the one it names
ENTRY_FIELDS = ("params", "label")
_COMPONENT_SECTIONS = {"dataset": DatasetConfig, "model": ModelConfig, "partition": PartitionConfig}


def _component_default(section: str, name: str) -> Any:
    """A component field's value when a component other than the default one is named: options
    empty (the component's own defaults), anything else its declared default."""
    return {} if name == "options" else getattr(_COMPONENT_SECTIONS[section](), name)


def merge_config(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """:func:`merge`, except that an override naming another component (``model: {name: cnn-tiny}``)
    drops the fields of the one it replaces (:data:`COMPONENT_FIELDS`), including the defaults that
    belong to the default component, and keeps the rest of the section (e.g. ``partition.clients``)."""
    out = dict(base)
    for section, owned in COMPONENT_FIELDS.items():
        new = override.get(section)
        if not isinstance(new, dict) or "name" not in new:
            continue
        section_data = out.get(section)
        current: dict[str, Any] = section_data if isinstance(section_data, dict) else {}
        if new["name"] != current.get("name", _COMPONENT_SECTIONS[section]().name):
            kept = {key: value for key, value in current.items() if key not in owned}
            out[section] = {**kept, **{key: _component_default(section, key) for key in owned}}
    return merge(out, override)


def _assignment(text: str, option: str = "--set") -> tuple[list[str], Any]:
    """``PATH=VALUE`` → (path segments, the value parsed as YAML: 2 → int, [1, 4] → list, x → str);
    errors name ``option``."""
    path, equals, value = text.partition("=")
    segments = path.strip().split(".")
    if not equals or not all(segments):
        raise UserInputError(f"{option}: '{text}' is not PATH=VALUE (a dotted path into the config, e.g. training.rounds=2)")
    return segments, parse_yaml(value, f"{option} {path}") if value.strip() else ""


def apply_sets(data: dict[str, Any], assignments: list[str], option: str = "--set") -> dict[str, Any]:
    """The config ``data`` with each ``PATH=VALUE`` of ``--set`` applied in order, as an override of
    just that value (components renamed as :func:`merge_config` does). A number in the path indexes
    a list of the resolved config (``defenses.1.epsilons=[1, 4]``); unknown fields are left for the
    schema, whose error names the field and the allowed ones. Errors name ``option`` (``--set``,
    or ``--over`` for a sweep's points)."""
    for text in assignments:
        segments, value = _assignment(text, option)
        resolved = to_mapping(from_mapping(AuditConfig, data))
        override: dict[str, Any] = {}
        target: Any = override
        current: Any = resolved
        for depth, segment in enumerate(segments):
            last = depth == len(segments) - 1
            where = ".".join(segments[:depth + 1])
            if isinstance(current, list):
                # ASCII digits only: str.isdigit() also accepts '²' or '٣', which int() refuses
                if not (segment.isascii() and segment.isdigit()) or int(segment) >= len(current):
                    raise UserInputError(f"{option} {where}: '{'.'.join(segments[:depth])}' is a list of {len(current)} "
                                         f"entries; allowed indices: 0–{len(current) - 1}")
                # a list is replaced whole (merge): the resolved list with this entry changed
                entries = [dict(e) if isinstance(e, dict) else e for e in current]
                index, rest = int(segment), segments[depth + 1:]
                entry = entries[index]
                if not rest or not isinstance(entry, dict):
                    entries[index] = _nested(rest, value)
                else:
                    if rest == ["name"] and value != entry.get("name"):
                        # another defense or attack: its own parameters and label, not the previous one's
                        entry = {key: v for key, v in entry.items() if key not in ENTRY_FIELDS}
                    entries[index] = merge(entry, _nested(rest, value))
                target[segments[depth - 1]] = entries
                break
            if depth and not isinstance(current, dict):
                raise UserInputError(f"{option} {where}: '{'.'.join(segments[:depth])}' is a value, not a section")
            if last:
                target[segment] = value
                break
            if isinstance(current.get(segment), list):
                current = current[segment]
                continue
            target = target.setdefault(segment, {})
            current = current.get(segment, {})
        data = merge_config(data, override)
    return data


def _nested(segments: list[str], value: Any) -> dict[str, Any]:
    """{'a': {'b': value}} from ['a', 'b']."""
    out: Any = value
    for segment in reversed(segments):
        out = {segment: out}
    return out


def load_config(path: str | Path | None = None, preset_name: str | None = None,
                overrides: dict[str, Any] | None = None, sets: list[str] | None = None) -> AuditConfig:
    """Resolve preset + config file + command-line overrides + ``--set PATH=VALUE`` assignments into
    a validated :class:`AuditConfig`."""
    user: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise UserInputError(f"config: file '{path}' does not exist")
        user = _mapping(read_yaml_file(path), str(path))
    named = user.pop("preset", None)
    if named is not None and not isinstance(named, str):
        raise UserInputError(f"preset: must be a string, got {named!r}")
    # "" names no preset (it is refused as unknown), rather than quietly meaning the default one
    chosen = preset_name if preset_name is not None else named if named is not None else "default"
    data = merge_config(merge_config(preset(chosen), user), overrides or {})
    return from_mapping(AuditConfig, apply_sets(data, list(sets or [])))


def config_to_yaml(config: AuditConfig) -> str:
    return yaml.safe_dump(to_mapping(config), sort_keys=False, allow_unicode=True)
