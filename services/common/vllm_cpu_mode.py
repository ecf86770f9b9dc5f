"""How vLLM's CPU build is started on a given CPU: its dtype, and eager or compiled.

vLLM 0.32's CPU build computes bf16 wrongly on an AMX Xeon when it runs
eagerly (`--enforce-eager`): asked "What is the capital of France?" at
temperature 0 it answers "L'Étoile, la Marseillaise, la femme…"; compiled (its
default) it answers "Paris" (issue #32; its bf16 GEMMs use AMX there). Float32
never reaches AMX (AMX computes bf16 and int8 only), and the tests' eager
float32 vLLM passed on that Xeon. Eager is otherwise the cheaper start: a
compiled start costs minutes of torch.compile on a 2-core CPU
(docs/vllm-backend.md has the measurement). So:

- no AMX: as asked; dtype `auto` is bfloat16 with native bf16 (AVX512-BF16),
  else float32 (emulated bf16 ran at a third of float32's speed on an AVX2
  EPYC); eager unless compiling is asked for.
- AMX, bf16: never eager. Eager asked for without a dtype (`auto`: the caller
  wants a cheap start, not bf16): eager float32. Otherwise compiled bf16.

One function decides for local mode (tools/local/vllm_replicas.py), the
tests' and benchmarks' servers (tools/peers/vllm_server.py) and the
operator's pods (operators/modeldeployment/vllm_pod.py). The operator cannot
see the node's CPU: it passes `flags=None`, read as "may have AMX", so a pod
never runs eager bf16. Whatever the choice, the adapter's start-up
known-answer check (services/engine/known_answer.py) keeps a vLLM that
computes wrongly from serving. No torch here: `maas up` and the operator
import it.
"""

from dataclasses import dataclass

from maas_services.common.machine_profile import AMX_FLAGS, BF16_FLAGS


@dataclass(frozen=True)
class VllmCpuMode:
    dtype: str  # vLLM's --dtype; "auto" only where the CPU is not known
    enforce_eager: bool
    reason: str


def vllm_cpu_mode(
    flags: frozenset[str] | None, dtype: str = "auto", enforce_eager: bool | None = None
) -> VllmCpuMode:
    """The mode for a CPU with `flags` (None: not known), given what was asked.

    `dtype`: vLLM's --dtype, or "auto"; `enforce_eager`: True or False as
    asked, None for this function's choice (eager where it is right).
    """
    chosen = dtype
    if dtype == "auto" and flags is not None:
        chosen = "bfloat16" if flags & BF16_FLAGS else "float32"
    may_have_amx = flags is None or bool(flags & AMX_FLAGS)
    may_be_bf16 = chosen in ("bfloat16", "auto")
    if not (may_have_amx and may_be_bf16) or enforce_eager is False:
        eager = enforce_eager is not False
        how = "eager" if eager else "compiled"
        asked = "as asked" if enforce_eager is not None else "a start without compiling"
        return VllmCpuMode(chosen, eager, f"{how} {chosen}: {asked}, right on this CPU")
    cpu = "an AMX CPU" if flags is not None else "a CPU that may have AMX (not known here)"
    if enforce_eager and dtype == "auto":
        why = f"eager float32: vLLM 0.32's eager bf16 is wrong on {cpu}, eager float32 is right"
        return VllmCpuMode("float32", True, why)
    return VllmCpuMode(
        chosen, False, f"compiled {chosen}: vLLM 0.32's eager bf16 is wrong on {cpu}"
    )
