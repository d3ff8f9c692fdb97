"""Ask vLLM's own `vllm serve` argument parser which options exist, and check a --config YAML.

Run it with a Python that has vLLM installed (no GPU needed: the parser is plain Python), e.g.

    /tmp/vllmcpu/bin/python scripts/vllm_flags.py dump tests/data/vllm-0.24.0-serve-flags.json
    /tmp/vllmcpu/bin/python scripts/vllm_flags.py check serve.yaml [MODEL]

The parser is built the way `vllm serve` builds it (vllm.entrypoints.cli.main.main):
a FlexibleArgumentParser with the subcommands of every CLI module, the `serve` one from
ServeSubcommand.subparser_init -> vllm.entrypoints.openai.cli_args.make_arg_parser
(FrontendArgs.add_cli_args + AsyncEngineArgs.add_cli_args).

`check` parses ["serve", (MODEL,) "--config", FILE] with that parser, as `vllm serve --config FILE`
does (FlexibleArgumentParser.parse_args -> _pull_args_from_config -> load_config_file), then runs
ServeSubcommand.validate (vllm.entrypoints.cli.main runs it before dispatching). Exit status:
0 accepted; 2 argparse rejected it (vLLM's usage + error on stderr); 1 vLLM raised another error.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any

# vLLM logs to stdout by default; keep stdout for this script's JSON. Must precede `import vllm`.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

SOURCE = (
    "vllm.entrypoints.cli.main.main() parser construction, replicated: "
    "vllm.utils.argparse_utils.FlexibleArgumentParser('vLLM CLI') "
    "+ add_subparsers(dest='subparser') + cmd_init()/subparser_init() of "
    "vllm.entrypoints.cli.{{openai,serve,launch,benchmark.main,collect_env,run_batch}}; "
    "options read from the 'serve' subparser built by "
    "vllm.entrypoints.cli.serve.ServeSubcommand.subparser_init -> "
    "vllm.entrypoints.openai.cli_args.make_arg_parser (FrontendArgs.add_cli_args + "
    "AsyncEngineArgs.add_cli_args). Platform: {platform}."
)

# Rewritten by FlexibleArgumentParser.parse_args before argparse sees it (-O3, -O=3, -O 3).
PREPROCESSED_ALIASES = {"-O": "--optimization-level"}


def _err(message: str) -> None:
    sys.stderr.write(message + "\n")


def _select_platform() -> str:
    """Resolve vLLM's platform; fall back to CpuPlatform when none is detected (no GPU here).

    Building the serve parser instantiates config dataclasses whose defaults need a device type,
    which vLLM's UnspecifiedPlatform lacks. `vllm bench` uses the same CpuPlatform fallback
    (vllm.entrypoints.cli.main). Option names, nargs and choices do not depend on the platform
    for vLLM's built-in platforms (Platform.pre_register_and_update is a no-op for them).
    """
    from vllm import platforms

    detected = platforms.current_platform
    if detected.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()  # read back by platforms.__getattr__
        return f"none detected ({type(detected).__name__}); CpuPlatform set as `vllm bench` does"
    return f"detected {type(detected).__name__}"


def build_cli_parser() -> tuple[Any, dict[str, Any], str]:
    """The top-level `vllm` parser and its subcommands, as vllm.entrypoints.cli.main.main builds."""
    platform = _select_platform()

    import vllm.entrypoints.cli.benchmark.main
    import vllm.entrypoints.cli.collect_env
    import vllm.entrypoints.cli.launch
    import vllm.entrypoints.cli.openai
    import vllm.entrypoints.cli.run_batch
    import vllm.entrypoints.cli.serve
    from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG, cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cmd_modules = [
        vllm.entrypoints.cli.openai,
        vllm.entrypoints.cli.serve,
        vllm.entrypoints.cli.launch,
        vllm.entrypoints.cli.benchmark.main,
        vllm.entrypoints.cli.collect_env,
        vllm.entrypoints.cli.run_batch,
    ]
    cli_env_setup()
    parser = FlexibleArgumentParser(
        prog="vllm",  # main() leaves it to sys.argv[0], which is `vllm` for the console script
        description="vLLM CLI",
        epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    parser.add_argument(
        "-v", "--version", action="version", version=importlib.metadata.version("vllm")
    )
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds: dict[str, Any] = {}
    for cmd_module in cmd_modules:
        for cmd in cmd_module.cmd_init():
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            cmds[cmd.name] = cmd
    return parser, cmds, platform


def serve_subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices["serve"]
            return sub
    raise RuntimeError("the vllm parser has no 'serve' subcommand")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_jsonable(v) for v in value), key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def _type_name(action: argparse.Action) -> str | None:
    if action.type is None:
        return None
    return str(getattr(action.type, "__name__", repr(action.type)))


def _describe(action: argparse.Action, option: str, registered: bool = True) -> dict[str, Any]:
    boolean_optional = isinstance(action, argparse.BooleanOptionalAction)
    return {
        "action": type(action).__name__,
        "boolean_optional": boolean_optional,
        "choices": None if action.choices is None else [_jsonable(c) for c in action.choices],
        "dest": action.dest,
        "nargs": action.nargs,
        "negated": boolean_optional and option.startswith("--no-"),
        "registered": registered,
        "takes_value": action.nargs != 0,
        "type": _type_name(action),
    }


def dump(out: Path) -> int:
    parser, _cmds, platform = build_cli_parser()
    serve = serve_subparser(parser)
    options: dict[str, dict[str, Any]] = {}
    positionals: dict[str, dict[str, Any]] = {}
    for action in serve._actions:
        if not action.option_strings:
            positionals[action.dest] = {
                "dest": action.dest,
                "nargs": action.nargs,
                "type": _type_name(action),
            }
        for option in action.option_strings:
            options[option] = _describe(action, option)
    for alias, target in PREPROCESSED_ALIASES.items():
        options[alias] = _describe(serve._option_string_actions[target], alias, registered=False)
    data = {
        "generated_by": "scripts/vllm_flags.py dump",
        "notes": (
            "options: every option string of the `vllm serve` argparse parser (registered: true), "
            "plus aliases FlexibleArgumentParser.parse_args rewrites before argparse "
            "(registered: false; -O3, -O=3 or -O 3 -> --optimization-level). negated: the --no-x "
            "form of a BooleanOptionalAction (stores False). takes_value: nargs != 0. Defaults "
            "are left out: some depend on the platform."
        ),
        "options": options,
        "positionals": positionals,
        "preprocessed_aliases": PREPROCESSED_ALIASES,
        "source": SOURCE.format(platform=platform),
        "vllm_version": importlib.metadata.version("vllm"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    _err(f"wrote {len(options)} options to {out}")
    return 0


def _resolve(serve: argparse.ArgumentParser, key: str) -> tuple[str, argparse.Action] | None:
    """The option a YAML key reaches: `--key` (underscores before the first '.' -> dashes, as
    FlexibleArgumentParser does), or the unique option it abbreviates (argparse allow_abbrev)."""
    option = "--" + key.split(".", 1)[0].replace("_", "-")
    actions = serve._option_string_actions
    if option in actions:
        return option, actions[option]
    matches = {o: a for o, a in actions.items() if o.startswith(option)}
    if len({a.dest for a in matches.values()}) == 1 and len(matches) == 1:
        return next(iter(matches.items()))
    return None


def _project(value: Any, yaml_value: Any) -> Any:
    """Show of a parsed value only the parts the YAML set (e.g. one field of a config object)."""
    if not isinstance(yaml_value, dict):
        return _jsonable(value)
    out: dict[str, Any] = {}
    for k, v in yaml_value.items():
        if isinstance(value, dict):
            out[str(k)] = _project(value.get(k, "<absent>"), v)
        else:
            out[str(k)] = _project(getattr(value, str(k), "<absent>"), v)
    return out


def check(config: Path, model: str | None) -> int:
    import yaml

    parser, cmds, _platform = build_cli_parser()
    serve = serve_subparser(parser)
    argv = ["serve", *([model] if model else []), "--config", str(config)]
    try:
        expanded: Any = parser._pull_args_from_config(list(argv))
    except Exception as exc:  # same error parse_args raises below
        expanded = f"<{type(exc).__name__}: {exc}>"
    try:
        ns = parser.parse_args(argv)
        cmds[ns.subparser].validate(ns)
    except SystemExit as exc:  # argparse already printed vLLM's usage and error to stderr
        _err(f"rejected: {argv} (expanded from the YAML: {expanded})")
        return int(exc.code) if isinstance(exc.code, int) else 1
    except Exception as exc:
        _err(f"rejected: {type(exc).__name__}: {exc}")
        _err(f"argv: {argv} (expanded from the YAML: {expanded})")
        return 1

    with open(config) as f:
        loaded = yaml.safe_load(f) or {}
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for raw_key, yaml_value in loaded.items():
        key = str(raw_key)
        # load_config_file passes neither `false` nor `[]` on to argparse
        dropped = yaml_value is False or yaml_value == []
        resolved = _resolve(serve, key)
        if resolved is None:
            values[key] = {"dropped": dropped, "option": None, "yaml": _jsonable(yaml_value)}
            warnings.append(
                f"{key!r} is no `vllm serve` option"
                + (", unnoticed: load_config_file dropped it" if dropped else "")
            )
            continue
        option, action = resolved
        sub_keys = key.split(".")[1:]
        shaped: Any = yaml_value
        for sub_key in reversed(sub_keys):
            shaped = {sub_key: shaped}
        values[key] = {
            "dest": action.dest,
            "dropped": dropped,
            "option": option,
            "value": _project(getattr(ns, action.dest), shaped),
            "yaml": _jsonable(yaml_value),
        }
        if yaml_value is False and isinstance(action, argparse.BooleanOptionalAction):
            fix = "" if option.startswith("--no-") else f"; `no-{option[2:]}: true` sets it False"
            warnings.append(f"{key}: false is dropped by load_config_file (default kept){fix}")
        elif dropped:
            warnings.append(f"{key}: {yaml_value!r} is dropped by load_config_file")
    if model is None and ns.model_tag is not None:
        warnings.append(
            f"model_tag {ns.model_tag!r} came from the YAML: a value after an option that takes "
            'none (e.g. `enable-prefix-caching: "false"`) became the positional model, '
            "which overrides `model:`"
        )
    for warning in warnings:
        _err(f"warning: {warning}")
    result = {
        "accepted": True,
        "argv": argv,
        "expanded_argv": expanded,
        # ServeSubcommand.cmd: a positional model_tag overrides --model / `model:`.
        "model": ns.model_tag if ns.model_tag is not None else ns.model,
        "values": values,
        "vllm_version": importlib.metadata.version("vllm"),
        "warnings": warnings,
    }
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


def same(config: Path, launched: list[str], ignore: list[str]) -> int:
    """Does ``vllm serve --config FILE`` parse to what the launched ``vllm serve ARGV...`` parsed
    to? Compares every argparse dest except ``ignore`` (flags left out of the export on purpose,
    e.g. host and port). Prints the differences; exit 0 when there are none."""
    parser, _cmds, _platform = build_cli_parser()
    a = vars(parser.parse_args(["serve", *launched]))
    b = vars(parser.parse_args(["serve", "--config", str(config)]))
    # the model: positional in the launch, `model:` (-> --model) in the YAML
    a["model"] = a.pop("model_tag", None) or a.get("model")
    b["model"] = b.pop("model_tag", None) or b.get("model")
    skip = {"config", *ignore}
    diff = {
        k: {"launched": _jsonable(a.get(k)), "config": _jsonable(b.get(k))}
        for k in sorted(set(a) | set(b))
        if k not in skip and _jsonable(a.get(k)) != _jsonable(b.get(k))
    }
    sys.stdout.write(json.dumps({"same": not diff, "differences": diff}, indent=2) + "\n")
    return 0 if not diff else 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True)
    p_dump = sub.add_parser("dump", help="write the `vllm serve` options as JSON")
    p_dump.add_argument("out", type=Path)
    p_check = sub.add_parser("check", help="parse FILE.yaml as `vllm serve --config FILE.yaml`")
    p_check.add_argument("config", type=Path)
    p_check.add_argument("model", nargs="?", default=None)
    p_same = sub.add_parser(
        "same", help="FILE.yaml parses to the same values as the launched `vllm serve` argv"
    )
    p_same.add_argument("config", type=Path)
    p_same.add_argument(
        "--ignore",
        default="host,port,served_model_name,api_key",
        help="comma-separated argparse dests not compared (left out of the export on purpose)",
    )
    p_same.add_argument("launched", nargs=argparse.REMAINDER, help="-- MODEL FLAGS...")
    args = ap.parse_args(argv)
    if args.command == "dump":
        return dump(args.out)
    if args.command == "same":
        launched = args.launched[1:] if args.launched[:1] == ["--"] else args.launched
        return same(args.config, launched, [d for d in args.ignore.split(",") if d])
    return check(args.config, args.model)


if __name__ == "__main__":
    sys.exit(main())
