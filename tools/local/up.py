"""`maas up`: run the whole stack locally until Ctrl-C or SIGTERM.

A child that dies is restarted while the rest keep serving; only one that keeps
dying at start stops the stack (maas_tools.local.supervisor).
"""

import asyncio
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from tqdm import tqdm

from maas_services.common.logging import get_logger
from maas_tools.local.readiness import StartupError
from maas_tools.local.stack import Stack, StackConfig
from maas_tools.local.supervisor import CrashLoop

log = get_logger(__name__)

EXAMPLES = """\
maas is ready at {url}/v1 in {seconds:.1f}s (model {model}, {replicas} engine(s), logs in {logs})

  curl {url}/v1/chat/completions \\
    -H "Authorization: Bearer $(cat {key_file})" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  python -c 'from openai import OpenAI; c = OpenAI(base_url="{url}/v1", \\
    api_key=open("{key_file}").read().strip()); r = c.chat.completions.create( \\
    model="{model}", messages=[{{"role": "user", "content": "Hello!"}}]); \\
    print(r.choices[0].message.content)'

Ctrl-C stops everything."""


def machine_defaults(engine_log: Path) -> str:
    """What the engine chose for this machine, from its `engine_machine_defaults` log line."""
    try:
        lines = engine_log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if '"engine_machine_defaults"' not in line:
            continue
        entry = json.loads(line)
        omp = " ".join(f"{k}={v}" for k, v in entry["omp"].items())
        threads, wide_rows = entry["torch_threads"], entry["compute_wide_rows"]
        if threads > 1 and wide_rows > 1:
            threads = f"{threads} from {wide_rows} rows a step, {threads - 1} below"
        narrowed = [
            what
            for what, setting in (("matmuls", "wide_gemm"), ("KV cache", "kv_cache_dtype"))
            if entry.get(setting) == "bf16"
        ]
        notes = [f"bf16 {' and '.join(narrowed)}"] if narrowed else []
        if entry.get("wide_gemm") == "int8":  # opt-in (--wide-gemm int8)
            notes.append("int8 activations on the checkpoint's blocks")
        dtype = entry["dtype"] + (f" ({', '.join(notes)})" if notes else "")
        return (
            f"engine on {entry['cpu_model']} ({' '.join(entry['cpu_flags']) or 'no SIMD flags'}"
            f"{', ' + entry['gpu'] if entry['gpu'] else ''}): {dtype}, "
            f"compute threads {threads}, {omp}, quantization "
            f"{entry['quantization']}, speculation up to batch {entry['speculative_max_batch']} "
            "(why: engine_machine_defaults in its log)\n"
        )
    return ""


def display_path(path: Path) -> str:
    """Relative to the working directory when inside it, else absolute."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


async def run(config: StackConfig, model_id: str) -> int:
    started = time.perf_counter()
    stack = Stack(config)
    bar = tqdm(total=stack.expected_children, desc="starting maas", unit="service", leave=False)

    def ready(name: str) -> None:
        bar.set_postfix_str(f"{name} ready")
        bar.update()

    stack.on_ready = ready
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        starting = asyncio.create_task(stack.start())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            starting.cancel()
            return 130
        stopping.cancel()
        starting.result()
        bar.close()
        print(
            machine_defaults(config.state_dir / "logs" / "engine-0.log")
            + EXAMPLES.format(
                url=stack.gateway_url,
                seconds=time.perf_counter() - started,
                model=model_id,
                replicas=config.engine_replicas,
                logs=config.state_dir / "logs",
                key_file=display_path(config.state_dir / "dev-api-key"),
            ),
            flush=True,
        )
        stopping = asyncio.create_task(stop.wait())
        supervising = asyncio.create_task(stack.supervise())
        await asyncio.wait({supervising, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        # Ended before the children stop, or it would start them again; a
        # CrashLoop it ended with is raised here.
        supervising.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervising
        return 0
    except StartupError as exc:
        log.error("startup_failed", error=str(exc))
        return 1
    except CrashLoop as exc:
        log.error("child_crash_looping", error=str(exc))
        print(f"maas up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("stopping...", flush=True)
        stack.stop()


def up(config: StackConfig, model_id: str) -> int:
    return asyncio.run(run(config, model_id))
