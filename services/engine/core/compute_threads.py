"""The engine core's compute threads, chosen per step from the rows the step computes.

An OpenMP team waits at every op for its slowest thread. On a machine where
the team holds every core, the serving process (it wakes for every token),
the gateway, tokenizer and router take one of the team's cores each time they
run, and a narrow step (a few decode rows, bound by reading the weights)
stalls for as long as they do; a wide step (many decode rows, a prefill
chunk: compute-bound matmuls) loses little to such a preemption and gains
nearly the whole core it would leave. So a step of `wide_rows` rows or more
computes on every thread (--torch-threads), a narrower one on one thread
fewer, leaving that core to the serving side. The default is 1, every step
on every thread: with the decode step one native call, the second core pays
more at 1 and 8 streams than the preemptions cost (machine_defaults.py);
--compute-wide-rows 32 is for a machine whose other work holds a core.

torch.set_num_threads reaches ATen's own parallel loops, MKL's GEMMs (which
run on the same libgomp) and the int8/int4 AVX2 kernel, which is given
torch.get_num_threads() per call (quantization/cpu_kernel.py).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ComputeThreads:
    wide: int  # threads for a wide step: --torch-threads, resolved
    wide_rows: int  # rows from which a step is wide: --compute-wide-rows, resolved

    def __post_init__(self):
        if self.wide < 1 or self.wide_rows < 1:
            raise ValueError(f"unresolved compute threads {self} (machine_defaults.resolve)")

    @property
    def narrow(self) -> int:
        return max(1, self.wide - 1)

    def for_rows(self, rows: int) -> int:
        """Threads for a step that computes `rows` rows (decode rows + prefill tokens)."""
        return self.wide if rows >= self.wide_rows else self.narrow

    def apply(self, rows: int) -> None:
        """Set torch's threads for this step on the calling thread (the step's)."""
        threads = self.for_rows(rows)
        # Only on a change: set_num_threads also clears oneDNN's primitive cache.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
