"""The whole platform as local processes: what `maas up` and the tests run.

Order matters: Redis first (everyone's state), then the model-holding services
in parallel, then the router and the gateway; shutdown is the reverse, so the
gateway stops taking requests before anything behind it goes away.

Once started, `supervise()` restarts any child that dies (maas_tools.local.supervisor);
each child keeps its ports across restarts, so nobody needs new addresses.

Trust: the state folder keeps the stack's secrets, each mode 0600 (maas_tools.local.private_file):
the service token every internal gRPC server demands (maas_services.common.service_token) and
a password per Redis ACL user (maas_services.common.redis_acl). Children get them by
environment, never a flag, and each only its own: the gateway and billing their own
user's Redis URL, the rest none; stack.json keeps the admin user's for the CLI.
"""

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from maas_services.billing.health import LIVENESS_SERVICE
from maas_services.common.logging import get_logger
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.redis_acl import USER_NAMES
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.gateway.admission.tenants import TenantStore
from maas_tools.local.dev_tenant import ensure_dev_key
from maas_tools.local.ports import free_port
from maas_tools.local.private_file import private_secret, write_private
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from maas_tools.local.supervisor import RestartPolicy, supervise
from maas_tools.local.vllm_replicas import (
    VllmOptions,
    engine_env,
    engine_flags,
    prepare,
    replica_config,
)
from maas_tools.peers.vllm_server import vllm_process

log = get_logger(__name__)


@dataclass
class StackConfig:
    state_dir: Path = Path(".maas")
    host: str = "127.0.0.1"
    gateway_port: int = 8080
    engine_replicas: int = 1
    # Passed verbatim to every engine, e.g. ["--dtype", "float32"].
    engine_args: list[str] = field(default_factory=list)
    # LoRA adapters every engine loads at start, NAME=PATH (--lora-modules).
    lora_modules: list[str] = field(default_factory=list)
    redis_url: str = ""
    startup_timeout: float = 600.0
    stop_timeout: float = 30.0
    # The gateway's routing table; None means state_dir/routes.yaml. A missing
    # file serves every model under its own name until one is written.
    routes_file: Path | None = None
    # The router's policy: prefix_affinity, least_load or round_robin.
    routing_policy: str = "prefix_affinity"
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    # native: our engine; vllm: each replica an engine in front of its own vLLM
    # server (maas_tools.local.vllm_replicas).
    engine_backend: str = "native"
    vllm: VllmOptions = field(default_factory=VllmOptions)
    model_id: str = DEFAULT_MODEL_ID


@dataclass
class Stack:
    config: StackConfig
    # The admin user's URL: what `maas tenants|keys|billing` use.
    redis_url: str = ""
    # Each ACL user's URL, with its password (all the same given an external Redis).
    redis_urls: dict[str, str] = field(default_factory=dict)
    gateway_url: str = ""
    gateway_grpc: str = ""
    api_key: str = ""
    service_token: str = ""
    addresses: dict[str, str] = field(default_factory=dict)
    metrics_urls: dict[str, str] = field(default_factory=dict)
    # Each vLLM replica's own OpenAI server (a benchmark calls it directly).
    vllm_urls: dict[str, str] = field(default_factory=dict)
    # Each vLLM-backed engine's environment: its vLLM server's key.
    engine_envs: dict[str, dict[str, str]] = field(default_factory=dict)
    processes: list[ManagedProcess] = field(default_factory=list)
    # Called with a child's name each time one becomes ready (progress display).
    on_ready: Callable[[str], None] = lambda name: None

    @property
    def expected_children(self) -> int:
        """Children start() waits for: redis (unless external), tokenizer, engines,
        billing, router and gateway, and a vLLM server per engine on that backend."""
        cfg = self.config
        engines = cfg.engine_replicas * (2 if cfg.engine_backend == "vllm" else 1)
        return (0 if cfg.redis_url else 1) + engines + 4

    async def _ready(self, process: ManagedProcess) -> None:
        await wait_ready(process, process.probe, self.config.startup_timeout)
        self.on_ready(process.name)

    def _log_path(self, name: str) -> Path:
        return self.config.state_dir / "logs" / f"{name}.log"

    def _launch(self, process: ManagedProcess) -> ManagedProcess:
        process.start()
        self.processes.append(process)
        return process

    def _spawn(self, name: str, argv: list[str], probe: str, env=None) -> ManagedProcess:
        env = {SERVICE_TOKEN_ENV: self.service_token, **(env or {})}
        return self._launch(ManagedProcess(name, argv, self._log_path(name), env=env, probe=probe))

    async def _engine_flags(self) -> list[dict]:
        """Each replica's flags; on the vLLM backend, its vLLM server is started here."""
        cfg = self.config
        names = [f"engine-{index}" for index in range(cfg.engine_replicas)]
        if cfg.engine_backend != "vllm":
            return [{"engine-id": name} for name in names]
        runtime = await prepare()
        options = cfg.vllm
        if cfg.lora_modules:
            # vLLM holds the adapters itself; it spells the flag as ours.
            lora = ["--enable-lora", "--lora-modules", *cfg.lora_modules]
            options = dataclasses.replace(options, args=[*options.args, *lora])
        flags = []
        for index, name in enumerate(names):
            vllm = replica_config(
                runtime, options, cfg.model_id, index, cfg.engine_replicas, cfg.host
            )
            server = f"vllm-{index}"
            self._launch(vllm_process(vllm, server, self._log_path(server)))
            self.vllm_urls[server] = vllm.url
            flags.append({"engine-id": name, **engine_flags(vllm)})
            self.engine_envs[name] = engine_env(vllm)
        return flags

    def _service(self, name: str, service: str, flags: dict, extra=None, env=None) -> tuple:
        port, metrics_port = free_port(self.config.host), free_port(self.config.host)
        self.addresses[name] = f"{self.config.host}:{port}"
        self.metrics_urls[name] = f"http://{self.config.host}:{metrics_port}/metrics"
        flags = {"host": self.config.host, "port": port, "metrics-port": metrics_port, **flags}
        address = self.addresses[name]
        return self._spawn(name, serve_argv(service, flags, extra), address, env), address

    async def start(self) -> "Stack":
        cfg = self.config
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.service_token = private_secret(cfg.state_dir / "service-token")
        self.redis_urls = dict.fromkeys(USER_NAMES, cfg.redis_url)
        if not cfg.redis_url:
            port = free_port(cfg.host)
            passwords = {
                user: private_secret(cfg.state_dir / f"redis-password-{user}")
                for user in USER_NAMES
            }
            self.redis_urls = {
                user: f"redis://{user}:{password}@{cfg.host}:{port}/0"
                for user, password in passwords.items()
            }
            redis = redis_process(cfg.state_dir, port, passwords)
            redis.probe = self.redis_urls["probe"]
            redis.start()
            self.processes.append(redis)
            await self._ready(redis)
        self.redis_url = self.redis_urls["admin"]

        # The URLs hold passwords: by environment, like the token.
        def redis_env(user: str) -> dict[str, str]:
            return {"MAAS_REDIS_URL": self.redis_urls[user]}

        stage = [self._service("tokenizer", "tokenizer", {})]
        engines = []
        for flags in await self._engine_flags():
            name = flags["engine-id"]
            env = self.engine_envs.get(name)
            if cfg.engine_backend == "native":
                flags["lora-modules"] = cfg.lora_modules
            stage.append(self._service(name, "engine", flags, cfg.engine_args, env))
            engines.append(f"{name}={self.addresses[name]}")
        # A vLLM server is ready on /health; its engine waits for it too.
        stage += [(p, p.probe) for p in self.processes if p.name in self.vllm_urls]
        # Line items in the state folder's SQLite, where `maas billing` finds them.
        database = f"sqlite:///{(cfg.state_dir / 'billing.db').resolve()}"
        billing, billing_addr = self._service(
            "billing",
            "billing",
            {"consumer-name": "billing-0"},
            env={**redis_env("billing"), "MAAS_BILLING_DATABASE_URL": database},
        )
        # Ready once its consumer keeps up; restarted, alive is enough (Redis may be down).
        billing.restart_probe = f"{billing_addr}/{LIVENESS_SERVICE}"
        stage.append((billing, billing_addr))
        await asyncio.gather(*(self._ready(p) for p, _ in stage))

        router, router_addr = self._service(
            "router", "router", {"engines": engines, "routing-policy": cfg.routing_policy}
        )
        await self._ready(router)

        grpc_port, metrics_port = free_port(cfg.host), free_port(cfg.host)
        self.gateway_url = f"http://{cfg.host}:{cfg.gateway_port}"
        gateway = self._spawn(
            "gateway",
            serve_argv(
                "gateway",
                {
                    "host": cfg.host,
                    "port": cfg.gateway_port,
                    "grpc-port": grpc_port,
                    "metrics-port": metrics_port,
                    "tokenizer-address": self.addresses["tokenizer"],
                    "router-address": router_addr,
                    "routes-file": cfg.routes_file or cfg.state_dir / "routes.yaml",
                    "billing-address": self.addresses["billing"],
                    "usage-spool-dir": cfg.state_dir / "spool",
                    # Stored responses beside billing's line items, in the state folder.
                    "responses-database-url": (
                        f"sqlite:///{(cfg.state_dir / 'responses.db').resolve()}"
                    ),
                    # Uploaded and batch output files (/v1/files), beside the records.
                    "files-dir": cfg.state_dir / "files",
                },
            ),
            f"{self.gateway_url}/readyz",
            redis_env("gateway"),
        )
        self.gateway_grpc = f"{cfg.host}:{grpc_port}"
        self.metrics_urls["gateway"] = f"http://{cfg.host}:{metrics_port}/metrics"
        await self._ready(gateway)

        redis = open_redis(self.redis_url)
        try:
            self.api_key = await ensure_dev_key(TenantStore(redis), cfg.state_dir)
        finally:
            await redis.aclose()
        self._write_state()
        return self

    def _write_state(self) -> None:
        """Let CLI commands find the running stack with no flags."""
        state = {
            "pid": os.getpid(),
            "redis_url": self.redis_url,
            "service_token": self.service_token,
            "gateway_url": self.gateway_url,
            "gateway_grpc": self.gateway_grpc,
            "services": self.addresses,
            "metrics": self.metrics_urls,
            "vllm": self.vllm_urls,
            "pids": {p.name: p.pid for p in self.processes},
            "restarts": {p.name: p.restarts for p in self.processes},
        }
        # It holds the Redis password and the service token.
        write_private(self.config.state_dir / "stack.json", json.dumps(state, indent=2))

    def dead(self) -> list[ManagedProcess]:
        return [p for p in self.processes if p.exited() is not None]

    async def supervise(self) -> None:
        """Restart children that die, until one keeps dying at start (raises CrashLoop).

        Cancel it before stop(), or it starts again what stop() ends.
        """
        cfg = self.config
        await supervise(self.processes, cfg.restart, cfg.startup_timeout, self._write_state)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(self.config.stop_timeout)
        (self.config.state_dir / "stack.json").unlink(missing_ok=True)
