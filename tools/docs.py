"""The documentation pages generated from the code: every config group and key (from the
dataclass schemas, with their defaults and the comments beside them), every CLI verb, and
the protocol's message bodies. `tests/test_docs.py` checks that the committed pages are
current and that the site builds with `mkdocs build --strict`.

    python tools/docs.py          # rewrite docs/reference/config.md, cli.md and docs/protocol.md"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment beside it or on the lines just above it}, over the class's MRO."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("#"):
                above.append(stripped.lstrip("# ").strip())
                continue
            match = re.match(r"^\s{4}(\w+)\s*:", line)
            if match:
                inline = line.split("  # ", 1)[1].strip() if "  # " in line else ""
                text = " ".join([*above, inline]).strip()
                if text:
                    comments[match.group(1)] = text
            above = []
    return comments


def type_name(field: dataclasses.Field) -> str:
    """The type as the schema spells it (`Optional[str]` read as `str or null`, `Union[int,
    str]` as `int or str`)."""
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    optional = re.fullmatch(r"Optional\[(.*)\]", text)
    union = re.fullmatch(r"Union\[(.*)\]", text)
    if union:
        return " or ".join(part.strip() for part in union.group(1).split(","))
    return f"{optional.group(1)} or null" if optional else text


def option_name(path: Path) -> str | None:
    """The registry name a group option selects: its own `name`, or its parent's (`defaults`)."""
    text = path.read_text()
    own = re.search(r"^name:\s*(\S+)\s*$", text, re.M)
    if own:
        return own.group(1)
    parent = re.search(r"^defaults:\s*\n\s*-\s*(\w+)", text, re.M)
    return option_name(path.parent / f"{parent.group(1)}.yaml") if parent else None


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return "(see below)"
    else:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def schema_table(cls: type, prefix: str = "") -> list[str]:
    comments = field_comments(cls)
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested = []
    for field in dataclasses.fields(cls):
        lines.append(
            f"| `{prefix}{field.name}` | {type_name(field)} | {default_of(field)} | "
            f"{comments.get(field.name, '').replace('|', '/')} |"
        )
        value = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(value):
            nested.append((field.name, type(value)))
    for name, klass in nested:
        lines += ["", f"`{prefix}{name}.*` ({klass.__name__}):", "", *schema_table(klass, f"{prefix}{name}.")]
    return lines


def config_reference() -> str:
    import embodied.components  # noqa: F401  (every built-in component's registry entry)
    import embodied.robots.components  # noqa: F401
    from embodied.config import GROUPS, EvalConfig, SFTConfig, TrainConfig
    from embodied.core.compose import CONFIG_DIR
    from embodied.core.registry import ROBOTS
    from embodied.demos import DemosConfig
    from embodied.reward_classifier import RewardClassifierConfig
    from embodied.robots.client import RobotClientConfig
    from embodied.robots.teleop import TeleopConfig
    from embodied.runtime.policy_server import ServeConfig

    lines = [
        "# Configuration reference",
        "",
        "Generated from the dataclass schemas (`python tools/docs.py`): every key, its type, its default and "
        "what it means. The schemas are the one source of defaults; a YAML file under `configs/` holds only "
        "what differs, and any key here can be set on the command line (`algo.lr=1e-4`).",
        "",
    ]
    tops = [
        ("train", TrainConfig, "embodied train"),
        ("sft", SFTConfig, "embodied sft"),
        ("eval", EvalConfig, "embodied eval"),
        ("serve", ServeConfig, "embodied serve"),
        ("demos", DemosConfig, "embodied demos"),
        ("reward", RewardClassifierConfig, "embodied reward"),
        ("robot", RobotClientConfig, "embodied robot, teleop, collect"),
    ]
    lines += ["## Top-level configs", ""]
    for name, cls, verb in tops:
        lines += [f"### `{name}.yaml` ({verb})", "", *schema_table(cls), ""]
    registries = {**GROUPS, "robot": ROBOTS}
    for group, registry in registries.items():
        lines += [f"## `{group}=`", ""]
        for name in registry.names():
            options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml") if option_name(p) == name)
            schema = registry.get(name).schema
            lines += [f"### `{name}` ({schema.__name__})", ""]
            if options:
                lines += ["Options: " + ", ".join(f"`{group}={o}`" for o in options), ""]
            lines += [*schema_table(schema, f"{group}."), ""]
    lines += [
        "## `teleop=`",
        "",
        "Options: " + ", ".join(f"`teleop={p.stem}`" for p in sorted((CONFIG_DIR / "teleop").glob("*.yaml"))),
        "",
        *schema_table(TeleopConfig, "teleop."),
        "",
    ]
    return "\n".join(lines)


def cli_reference() -> str:
    from embodied import cli

    return "\n".join(
        [
            "# Command-line reference",
            "",
            "Generated from `embodied/cli.py` (`python tools/docs.py`). Every verb takes Hydra overrides "
            "(`key=value`, `group=option`) after it; the keys are in the "
            "[configuration reference](config.md).",
            "",
            "```text",
            cli.__doc__.strip(),
            "```",
            "",
        ]
    )


def pages() -> dict[Path, str]:
    from embodied.core.messages import protocol_page

    return {
        DOCS / "reference" / "config.md": config_reference(),
        DOCS / "reference" / "cli.md": cli_reference(),
        DOCS / "protocol.md": protocol_page(),
    }


def main() -> int:
    for path, text in pages().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
