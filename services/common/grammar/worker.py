"""Compile grammars in a child process that is killed at its deadline.

xgrammar compiles in C++: a thread running it cannot be stopped, so a slow
grammar keeps its thread, its memory and a core for as long as it takes.
Here each compile runs in one long-lived child process that lowers its own
CPU priority (os.nice: serving threads win the cores), caps its own address
space (RLIMIT_AS, set once it has started, so the cap is what a compile may
add), and parses, measures (cost.py) and compiles one grammar at a time.
The parent waits for the answer until the deadline; past it the child is
killed and reaped before the caller hears, so nothing it did runs on, and
the next compile starts a new child. The compiled grammar comes back as
xgrammar's JSON (CompiledGrammar.serialize_json) and the parent rebuilds it
against its own TokenizerInfo (deserialize_json).

Starting a child costs Python, xgrammar's import and the vocabulary shipped
as TokenizerInfo.serialize_json (docs/structured-outputs.md has the
numbers), paid once, outside any compile's deadline. Each answer carries the
CPU seconds the compile took, the child's own clock, or, for a killed child,
what the kernel counted for it; the tokenizer charges them to the tenant.

Wire: each message is an 8-byte big-endian length and a msgpack body.
"""

import contextlib
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import msgspec

from maas_services.common.grammar.cost import CostCaps
from maas_services.common.grammar.spec import GrammarError, GrammarSpec

HEADER = 8


@dataclass(frozen=True)
class WorkerLimits:
    deadline_s: float = 10.0
    # Address space a compile may add to what the started child holds.
    memory_bytes: int = 1 << 30
    nice: int = 10
    caps: CostCaps = CostCaps()
    # Python, xgrammar's import and the vocabulary: far more than they take.
    start_timeout_s: float = 120.0


class CompileFailed(GrammarError):
    """The grammar was refused or its compile did not finish; cpu_seconds it used."""

    def __init__(self, message: str, cpu_seconds: float = 0.0):
        super().__init__(message)
        self.cpu_seconds = cpu_seconds


@dataclass(frozen=True)
class Compiled:
    grammar_json: str
    cpu_seconds: float


class GrammarWorker:
    """One child process, started on first use and again after it was killed.

    Blocking and one compile at a time: callers run it on a thread of their own.
    """

    def __init__(self, tokenizer_info_json: str, limits: WorkerLimits = WorkerLimits()):
        self.limits = limits
        self._info = tokenizer_info_json
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._cpu_at_last_answer = 0.0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        """Start the child now, if it is not running (a compile would start it anyway)."""
        with self._lock:
            self._ensure_started()

    def compile(self, spec: GrammarSpec) -> Compiled:
        """The compiled grammar's JSON; CompileFailed naming why not."""
        with self._lock:
            self._ensure_started()
            try:
                answer = self._ask({"kind": spec.kind, "text": spec.text}, self.limits.deadline_s)
            except TimeoutError:
                spent = self._stop()
                raise CompileFailed(
                    f"the grammar did not compile within {self.limits.deadline_s:g} s; simplify it",
                    spent,
                ) from None
            except EOFError:
                spent = self._stop()
                raise CompileFailed(
                    "the grammar compiler ran out of memory or failed on this grammar", spent
                ) from None
            spent = answer["cpu"] - self._cpu_at_last_answer
            self._cpu_at_last_answer = answer["cpu"]
            if "error" in answer:
                raise CompileFailed(answer["error"], spent)
            return Compiled(answer["json"], spent)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self._stop()
        limits = self.limits
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, msgspec.json.encode(limits).decode()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            ready = self._ask({"tokenizer_info": self._info}, limits.start_timeout_s)
        except (TimeoutError, EOFError):
            self._stop()
            raise CompileFailed("the grammar compiler could not start") from None
        self._cpu_at_last_answer = ready["cpu"]

    def _ask(self, message: dict, timeout_s: float) -> dict:
        process = self._process
        body = msgspec.msgpack.encode(message)
        try:
            process.stdin.write(len(body).to_bytes(HEADER, "big") + body)
            process.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        deadline = time.monotonic() + timeout_s
        fd = process.stdout.fileno()
        size = int.from_bytes(_read(fd, HEADER, deadline), "big")
        return msgspec.msgpack.decode(_read(fd, size, deadline))

    def _stop(self) -> float:
        """Kill and reap the child; the CPU seconds it spent since its last answer."""
        process, self._process = self._process, None
        if process is None:
            return 0.0
        spent = 0.0
        if process.returncode is None:  # not reaped yet: the kernel still has its usage
            # os.kill, not Popen.kill, which may reap it (and its usage) first.
            os.kill(process.pid, signal.SIGKILL)
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            spent = max(0.0, usage.ru_utime + usage.ru_stime - self._cpu_at_last_answer)
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):  # unflushed bytes to a dead child
                stream.close()
        return spent


def _read(fd: int, size: int, deadline: float) -> bytes:
    """Exactly size bytes from fd; TimeoutError past the deadline, EOFError if it closed."""
    chunks, left = [], size
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# The child: `python -m maas_services.common.grammar.worker '<WorkerLimits as JSON>'`.


def _serve(limits: WorkerLimits) -> None:
    os.nice(limits.nice)
    # Imported here: the parent never needs it for this module.
    import xgrammar

    from maas_services.common.grammar import cost

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed must not corrupt the wire

    def receive() -> dict | None:
        header = stdin.read(HEADER)
        if len(header) < HEADER:
            return None
        return msgspec.msgpack.decode(stdin.read(int.from_bytes(header, "big")))

    def send(answer: dict) -> None:
        answer["cpu"] = time.process_time()
        body = msgspec.msgpack.encode(answer)
        stdout.write(len(body).to_bytes(HEADER, "big") + body)
        stdout.flush()

    info = xgrammar.TokenizerInfo.deserialize_json(receive()["tokenizer_info"])
    # One thread, and no cache: the parent keeps compiled grammars, per tenant.
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    address_space = _address_space()
    resource.setrlimit(
        resource.RLIMIT_AS, (address_space + limits.memory_bytes, resource.RLIM_INFINITY)
    )
    send({})
    while (request := receive()) is not None:
        spec = GrammarSpec(request["kind"], request["text"])
        try:
            grammar = cost.parse(spec)
            cost.measure(grammar).check(limits.caps)
            compiled = compiler.compile_grammar(grammar)
            send({"json": compiled.serialize_json()})
        except GrammarError as exc:
            send({"error": str(exc)})
        except (RuntimeError, ValueError, TypeError, MemoryError) as exc:
            # Past RLIMIT_AS, C++ throws std::bad_alloc, which reaches Python as either.
            if isinstance(exc, MemoryError) or "bad_alloc" in str(exc):
                mib = limits.memory_bytes >> 20
                send({"error": f"the grammar needs more than {mib} MiB of memory to compile"})
            else:
                send({"error": f"invalid {spec.kind}: {cost.error_message(exc)}"})


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    _serve(msgspec.json.decode(sys.argv[1], type=WorkerLimits))
