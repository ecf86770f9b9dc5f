"""The `maas` command: `maas up` (local mode), `maas serve SERVICE` and the tools.

Each tool parses its own flags (and prints its own --help); this parser only
picks the command, so `maas X --help` is always X's help.
"""

import argparse
import importlib.metadata
import os
import shlex
import sys

from maas_services.common.logging import configure_logging
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.settings import parse_settings
from maas_services.common.tracing import configure_tracing

# Engine flags vLLM spells as one flag with several values (`--lora-modules a=/x b=/y`).
MULTI_VALUE_FLAGS = ("--lora-modules",)


def repeated_flags(argv: list[str]) -> list[str]:
    """argv with each value of a MULTI_VALUE_FLAGS flag after its own flag, the form
    pydantic-settings reads a list from (`--lora-modules a=/x --lora-modules b=/y`)."""
    out, flag = [], None
    for token in argv:
        if token.startswith("-"):
            # The flag whose values follow, if it is one of them (also as --flag=value).
            name = token.split("=", 1)[0]
            flag = name if name in MULTI_VALUE_FLAGS else None
            out.append(token)
        elif flag is not None and out[-1] != flag:
            out += [flag, token]
        else:
            out.append(token)
    return out


def _serve(service: str, argv: list[str]) -> None:
    # Imported lazily: the engine pulls in torch, which other services never need.
    if service == "engine":
        argv = repeated_flags(argv)
        from maas_services.engine.server import main as run
        from maas_services.engine.settings import EngineSettings as Settings
    elif service == "tokenizer":
        from maas_services.tokenizer.server import main as run
        from maas_services.tokenizer.settings import TokenizerSettings as Settings
    elif service == "router":
        from maas_services.router.server import main as run
        from maas_services.router.settings import RouterSettings as Settings
    elif service == "billing":
        from maas_services.billing.server import main as run
        from maas_services.billing.settings import BillingSettings as Settings
    elif service == "operator":
        from maas_operator.modeldeployment.main import main as run
        from maas_operator.modeldeployment.settings import OperatorSettings as Settings
    else:
        from maas_services.gateway.server import main as run
        from maas_services.gateway.settings import GatewaySettings as Settings
    settings = parse_settings(Settings, argv, prog=f"maas serve {service}")
    if service == "engine" and settings.backend == "vllm":
        from maas_services.engine.vllm_backend.server import main as run
    configure_logging(service, settings.log_level, settings.log_format)
    configure_tracing(service)
    run(settings)


SERVICES = ("gateway", "tokenizer", "router", "engine", "billing", "operator")


def _version() -> str:
    try:
        return importlib.metadata.version("maas")
    except importlib.metadata.PackageNotFoundError:
        # Run from a checkout that was never installed (python -m maas_tools.cli).
        return "unknown (not installed)"


def _up_parser(sub) -> argparse.ArgumentParser:
    up = sub.add_parser(
        "up",
        help="start the whole stack locally",
        description="Start Redis, tokenizer, router, engines, billing and the gateway. "
        "Any other flag an engine knows (maas serve engine --help) is passed to every "
        "engine (e.g. --dtype float32); one no engine knows is refused.",
    )
    up.add_argument("--port", type=int, default=8080, help="gateway HTTP port")
    up.add_argument("--engine-replicas", type=int, default=1)
    up.add_argument("--state-dir", default=os.environ.get("MAAS_STATE_DIR", ".maas"))
    up.add_argument(
        "--redis-url",
        default=os.environ.get("MAAS_REDIS_URL", ""),
        help="use this Redis instead of starting one",
    )
    up.add_argument("--startup-timeout", type=float, default=600.0)
    up.add_argument(
        "--routes",
        default="",
        help="model routing table YAML, re-read on change (default: STATE_DIR/routes.yaml)",
    )
    up.add_argument(
        "--routing-policy",
        default="prefix_affinity",
        choices=["prefix_affinity", "least_load", "round_robin"],
        help="how the router picks an engine replica",
    )
    up.add_argument(
        "--engine-backend",
        default="native",
        choices=["native", "vllm"],
        help="vllm: each engine replica fronts its own vLLM server (CPU build, own venv "
        "built on first use)",
    )
    up.add_argument(
        "--vllm-kv-cache-gib", type=int, default=1, help="GiB of KV cache per vLLM replica"
    )
    up.add_argument(
        "--vllm-compile",
        action="store_true",
        help="let vLLM compile its model (minutes at first start) instead of eager; "
        "without it, eager where that is right on this CPU (compiled bf16 on AMX: "
        "services/common/vllm_cpu_mode.py)",
    )
    up.add_argument(
        "--vllm-args",
        default="",
        help='extra vLLM server flags, e.g. "--max-num-batched-tokens 1024"',
    )
    up.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) every engine loads at start, as vLLM spells it",
    )
    up.add_argument(
        "--kv-cache-memory",
        type=int,
        default=0,
        help="bytes of KV cache for every engine (0: the engine's own default)",
    )
    return up


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="maas", description="Model-as-a-Service platform")
    parser.add_argument("--version", action="version", version=f"maas {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run one service",
        description="Run one service; maas serve SERVICE --help lists its settings.",
    )
    serve.add_argument("service", choices=SERVICES)
    # REMAINDER: the service's flags, --help included, are the service's to parse.
    serve.add_argument("flags", nargs=argparse.REMAINDER, help="the service's flags")
    up_parser = _up_parser(sub)
    operator = sub.add_parser(
        "operator",
        help="ModelDeployment operator tools",
        description="Operator tools; maas operator TOOL --help lists its flags.",
    )
    operator.add_argument("tool", choices=["simulate"])
    operator.add_argument("flags", nargs=argparse.REMAINDER, help="the tool's flags")
    for admin in ("tenants", "keys"):
        sub.add_parser(admin, help=f"manage {admin} (see maas {admin} --help)", add_help=False)
    sub.add_parser("billing", help="usage, line items, charges and reconciliation", add_help=False)
    sub.add_parser("bench", help="load-test an OpenAI-compatible server", add_help=False)
    sub.add_parser(
        "conformance", help="hold an OpenAI-compatible server to the API", add_help=False
    )
    sub.add_parser("top", help="live view of a running stack", add_help=False)
    sub.add_parser("eval", help="model quality checks (maas eval perplexity)", add_help=False)
    sub.add_parser(
        "distill-draft", help="train a draft model for speculative decoding", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    if args.command in ("tenants", "keys"):
        from maas_tools.admin.cli import main as admin_main

        sys.exit(admin_main(args.command, rest))
    if args.command == "billing":
        from maas_tools.admin.billing import main as billing_main

        sys.exit(billing_main(rest))
    if args.command == "top":
        from maas_tools.top.cli import main as top_main

        sys.exit(top_main(rest))
    if args.command == "eval":
        from maas_tools.eval.cli import main as eval_main

        sys.exit(eval_main(rest))
    if args.command == "distill-draft":
        from maas_tools.distill.main import main as distill

        sys.exit(distill(rest))
    if args.command == "conformance":
        from maas_tools.conformance.main import main as conformance

        sys.exit(conformance(rest))
    if args.command == "bench":
        from maas_tools.bench.main import main as bench

        sys.exit(bench(rest))
    if args.command == "serve":
        _serve(args.service, args.flags)
        return
    if args.command == "operator":
        from maas_operator.modeldeployment.simulate import main as simulate

        sys.exit(simulate(args.flags))
    from pathlib import Path

    from maas_services.engine.settings import check_lora_modules
    from maas_tools.local.engine_flags import refused_flag
    from maas_tools.local.stack import StackConfig
    from maas_tools.local.up import up
    from maas_tools.local.vllm_replicas import VllmOptions

    if args.engine_replicas < 1:
        parser.error("--engine-replicas must be at least 1")
    if refused := refused_flag(rest, up_parser):
        up_parser.error(refused)
    try:
        check_lora_modules(args.lora_modules)
    except ValueError as exc:
        up_parser.error(f"--lora-modules: {exc}")
    configure_logging("local", "info", "console")
    config = StackConfig(
        state_dir=Path(args.state_dir),
        gateway_port=args.port,
        engine_replicas=args.engine_replicas,
        engine_args=rest
        + ([f"--kv-cache-memory={args.kv_cache_memory}"] if args.kv_cache_memory else []),
        lora_modules=args.lora_modules,
        redis_url=args.redis_url,
        startup_timeout=args.startup_timeout,
        routes_file=Path(args.routes) if args.routes else None,
        routing_policy=args.routing_policy,
        engine_backend=args.engine_backend,
        vllm=VllmOptions(
            kv_cache_gib=args.vllm_kv_cache_gib,
            enforce_eager=False if args.vllm_compile else None,
            args=shlex.split(args.vllm_args),
        ),
    )
    sys.exit(up(config, DEFAULT_MODEL_ID))


if __name__ == "__main__":
    main()
