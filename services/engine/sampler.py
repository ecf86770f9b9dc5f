"""Turn next-token logits into token ids, one request's settings per row."""

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import torch

from maas_services.engine.grammar.bitmask import apply_grammars
from maas_services.engine.native_argmax import argmax
from maas_services.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from maas_services.engine.grammar.matcher import GrammarState

# Dividing by a tiny temperature overflows to inf (NaN after softmax); far above that
# the distribution is already one-hot, so such requests are treated as greedy.
_GREEDY_BELOW = 1e-5

# How many of the most likely tokens top-p ranks before falling back to a
# sort of the whole vocabulary (_top_p_kept).
TOP_P_CANDIDATES = 256

# Sampled rows one op takes at once (_drawn): enough to share each op's fixed cost,
# few enough that the temporaries stay small. Wider groups' temporaries (a float64
# running mass is 393 KB a row) made glibc give the top of its heap back to the kernel
# after each step (its trim threshold follows the largest block freed) and fault it in
# again: minor page faults a decode step at temperature 1 (getrusage), groups of 4 at
# 8 / 32 rows: 0 / 0; of 8 at 8 rows 2,272; of 16 at 32 rows 6,080; all 64 rows at once
# 15,328 (the per-row code before: 0). Decode steps of sampled requests, one engine,
# the sampler swapped per step (AMD EPYC family 25 model 1, Zen 3, 2 threads), the
# step's postprocess ms (sampling and the tokens' bookkeeping) with groups of 1 / 2 /
# 4 / 8 / 16 rows (the per-row code before: "was"): temperature 1 at 8 rows 3.42 /
# 2.57 / 2.82 / 5.62 / 6.09 (was 2.77), at 32 rows 10.48 / 7.55 / 6.96 / 6.57 / 16.11
# (was 7.8), at 64 rows 22.48 / 15.11 / 13.41 / 12.65 / 12.32 (was 17.37); top-p 0.9
# at 64 rows 88.7 / 69.75 / 72.47 / 74.97 / 70.4 (was 84.73).
ROWS_AT_ONCE = 4


class SamplingRequest(Protocol):
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator
    grammar: "GrammarState | None"  # structured outputs: what the next token may be


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """Each request owns its random stream, so its samples do not depend on its batchmates."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def position_seed(seed: int, position: int) -> int:
    """The seed of output position `position` of a sample seeded `seed` (splitmix64).

    A seeded sample draws each token from a generator seeded by (its seed, the
    token's position), not from one stream advanced token by token: the draw
    for position p then depends on nothing but the seed and p, so a request
    migrated to another replica with its first p tokens (resume.py) draws
    position p exactly as the failed replica would have.
    """
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn in proportion to weights (non-negative, any total).

    Inverse CDF: the first token whose running mass reaches a uniform point of
    the total. torch.multinomial draws one exponential per token instead: ~1 ms
    a row for SmolLM2's 49,152 tokens on a CPU, a third of a 32-stream decode
    step at temperature 1 (OpenAI's default); a cumsum and a binary search are
    ~65 us. The running mass is float64, so a long vocabulary's tail keeps its
    share. The point lies in (0, total], and the search stops at the first
    position whose running mass reaches it, so a zero-weight token (masked, cut
    by top-k or top-p) is never the answer: its running mass is its
    predecessor's.
    """
    return _draw_from_running(weights.double().cumsum(-1), generator)


def _draw_from_running(cumulative: torch.Tensor, generator: torch.Generator) -> int:
    """draw's search, given the weights' float64 running mass."""
    uniform = torch.rand((), generator=generator, dtype=torch.float64, device=cumulative.device)
    return int(torch.searchsorted(cumulative, (1 - uniform) * cumulative[-1]))


def draw_generator(request: SamplingRequest) -> torch.Generator:
    """The generator the request's next token is drawn from (position_seed).

    A seeded request's own generator only keeps its seed (initial_seed): each
    draw gets a fresh one for its position. An unseeded one's stream runs on.
    """
    generator = request.generator
    if request.params.seed is None:
        return generator
    position = position_seed(generator.initial_seed(), len(request.output_ids))
    return torch.Generator(device=generator.device).manual_seed(position)


class Sampler:
    def __init__(self, eos_token_ids: Sequence[int]):
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, requests: Sequence[SamplingRequest]) -> list[int]:
        """logits is [vocab] or [len(requests), vocab], for each request's next position.

        The batch is processed as one [rows, vocab] tensor and its argmax
        crosses to the host once: per-row work is left to rows that sample
        (each from its own generator) or carry penalties.
        """
        rows = logits.float().reshape(len(requests), -1)
        rows = apply_grammars(rows, [request.grammar for request in requests])
        if not any(_samples(r) or _has_penalties(r) for r in requests):
            # Greedy: banning tokens (eos under ignore_eos, stops before min_tokens) can
            # change a row's argmax only where it is that argmax, the first of the row's
            # largest; else the masking and its undoing (a third of a batch-1 sampler)
            # are skipped.
            tokens = argmax(rows)
            vocab = rows.shape[-1]
            if all(self._unbanned(t, r, vocab) for t, r in zip(tokens, requests, strict=True)):
                return tokens
        with self._processed(rows, requests):
            tokens = argmax(rows)
            sampled = [i for i, request in enumerate(requests) if _samples(request)]
            for i, token in _drawn(rows, sampled, requests):
                tokens[i] = token
        return tokens

    def distribution(
        self, logits: torch.Tensor, request: SamplingRequest
    ) -> tuple[torch.Tensor | None, int]:
        """(next-token probabilities, or None when greedy; the processed argmax).

        A grammar's mask is not applied here but by the caller, for the whole
        batch at once (__call__, or speculative verification for its drafts).
        """
        rows = logits.float().reshape(1, -1)
        with self._processed(rows, [request]):
            argmax = int(rows[0].argmax())
            if request.params.temperature < _GREEDY_BELOW:
                return None, argmax
            return _probabilities(rows[0], request.params), argmax

    @contextmanager
    def _processed(self, rows: torch.Tensor, requests: Sequence[SamplingRequest]):
        """rows with penalties applied and banned tokens at -inf, in place, put back after.

        In place rather than on a copy of the batch: a copy of every row
        (64 x 49,152 floats) cost more than the rest of the sampler, and rows
        may be the caller's logits, which must come back as they were.
        """
        banned = [(i, t) for i, request in enumerate(requests) for t in self._banned_ids(request)]
        penalized = [i for i, request in enumerate(requests) if _has_penalties(request)]
        saved_rows = rows[penalized].clone() if penalized else None
        if banned:
            row_ids, token_ids = (list(ids) for ids in zip(*banned, strict=True))
            saved_scores = rows[row_ids, token_ids]
        # The model's logits are inference tensors, written in place only in
        # inference mode; what the caller computes from the rows keeps its own mode.
        try:
            with torch.inference_mode():
                for i in penalized:
                    self._penalize(rows[i], requests[i])
                if banned:
                    rows[row_ids, token_ids] = float("-inf")
            yield
        finally:
            with torch.inference_mode():
                if banned:
                    rows[row_ids, token_ids] = saved_scores
                if saved_rows is not None:
                    rows[penalized] = saved_rows

    def _penalize(self, logits: torch.Tensor, request: SamplingRequest) -> None:
        """In place, on one row of the batch's copy."""
        params = request.params
        if params.repetition_penalty != 1:
            # Hugging Face's rule over prompt and output: always push a seen token's logit down.
            seen = torch.tensor(
                sorted(set(request.prompt_ids) | set(request.output_ids)),
                dtype=torch.long,
                device=logits.device,
            )
            if seen.numel():
                scores = logits[seen]
                logits[seen] = torch.where(
                    scores > 0,
                    scores / params.repetition_penalty,
                    scores * params.repetition_penalty,
                )
        if (params.presence_penalty or params.frequency_penalty) and request.output_ids:
            # OpenAI's rule, over generated tokens only.
            output = torch.tensor(request.output_ids, dtype=torch.long, device=logits.device)
            ids, counts = output.unique(return_counts=True)
            logits[ids] -= params.presence_penalty + params.frequency_penalty * counts.float()

    def _unbanned(self, token: int, request: SamplingRequest, vocab: int) -> bool:
        """Whether masking the request's banned ids leaves its argmax token as it is.

        A banned id outside the vocabulary says no: the masked path raises on it, as it
        always has, and the request fails alone (llm_engine.py's isolation).
        """
        banned = self._banned_ids(request)
        return token not in banned and all(0 <= t < vocab for t in banned)

    def _banned_ids(self, request: SamplingRequest) -> list[int]:
        params = request.params
        too_early = len(request.output_ids) < params.min_tokens
        banned = []
        # A grammar decides where its output ends: banning the end it requires
        # would leave no token to sample.
        if (too_early or params.ignore_eos) and request.grammar is None:
            banned += self.eos_token_ids
        if too_early:
            banned += params.stop_token_ids
        return banned


def _samples(request: SamplingRequest) -> bool:
    return request.params.temperature >= _GREEDY_BELOW


def _has_penalties(request: SamplingRequest) -> bool:
    params = request.params
    return params.repetition_penalty != 1 or bool(
        (params.presence_penalty or params.frequency_penalty) and request.output_ids
    )


DrawRows = Callable[[torch.Tensor, list[SamplingParams], list[torch.Generator]], list[int]]


def _draw_rows(params: SamplingParams) -> DrawRows:
    """How a row under these settings is drawn: by its kind of cut."""
    if params.top_k:
        return _draw_top_k
    return _draw_top_p if params.top_p < 1 else _draw_whole


def _drawn(
    rows: torch.Tensor, sampled: list[int], requests: Sequence[SamplingRequest]
) -> list[tuple[int, int]]:
    """(row, token drawn) for each sampled row of the processed batch.

    The per-call cost of torch ops over a vocabulary-long row was most of a
    sampled row, so rows under the same kind of cut are scaled, and share
    their softmax, topk and running mass, as one op over up to ROWS_AT_ONCE
    rows each. Where top-k or top-p keep a few tokens, only those are drawn
    from (every other token weighs 0 in the whole row), in id order, as the
    whole row's draw orders them: each row draws the token _probabilities +
    draw would, but for float rounding at a bucket's edge.
    """
    kinds: dict[DrawRows, list[int]] = {}
    for i in sampled:
        kinds.setdefault(_draw_rows(requests[i].params), []).append(i)
    drawn: list[tuple[int, int]] = []
    for draw_rows, kind in kinds.items():
        for first in range(0, len(kind), ROWS_AT_ONCE):
            chunk = kind[first : first + ROWS_AT_ONCE]
            chunk_params = [requests[i].params for i in chunk]
            # Consecutive rows (every row of most batches samples) are a view, not a copy.
            together = chunk[-1] - chunk[0] + 1 == len(chunk)
            chunk_rows = rows[chunk[0] : chunk[-1] + 1] if together else rows[chunk]
            scaled = chunk_rows / _temperatures(chunk_params, rows.device)
            generators = [draw_generator(requests[i]) for i in chunk]
            drawn += zip(chunk, draw_rows(scaled, chunk_params, generators), strict=True)
    return drawn


def _temperatures(params: list[SamplingParams], device: torch.device) -> float | torch.Tensor:
    """The rows' divisor: one number where they share it (most batches), else a column."""
    temperatures = [p.temperature for p in params]
    if len(set(temperatures)) == 1:
        return temperatures[0]
    return torch.tensor(temperatures, device=device).unsqueeze(-1)


def _draw_whole(
    scaled: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    """Rows drawn from the whole vocabulary (temperature and min-p alone)."""
    probs = scaled.softmax(-1)
    for row, each in zip(probs, params, strict=True):
        _min_p(row, each.min_p)
    running = probs.double().cumsum(-1)
    return [_draw_from_running(row, g) for row, g in zip(running, generators, strict=True)]


def _draw_top_p(
    scaled: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    """Rows drawn from the tokens top-p keeps, found from one topk of them all."""
    probs = scaled.softmax(-1)
    ranked, order = _top_p_candidates(probs)
    return [
        _draw_kept(scaled[r], _top_p_kept(probs[r], ranked[r], order[r], p.top_p), p, g)
        for r, (p, g) in enumerate(zip(params, generators, strict=True))
    ]


def _draw_top_k(
    scaled: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> list[int]:
    """Rows drawn from the tokens top-k (then top-p among them) keeps."""
    return [
        _draw_kept(row, _top_k_kept(row, p), p, g)
        for row, p, g in zip(scaled, params, generators, strict=True)
    ]


def _kept(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """The ids of one row of temperature-scaled logits that top-k and top-p keep; None
    where neither cuts."""
    if params.top_k:
        return _top_k_kept(scaled, params)
    if params.top_p < 1:
        probs = scaled.softmax(-1)
        return _top_p_kept(probs, *_top_p_candidates(probs), params.top_p)
    return None


def _top_p_candidates(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, ids) of each row's TOP_P_CANDIDATES most likely tokens, most likely
    first: what _top_p_kept ranks first."""
    return probs.topk(min(TOP_P_CANDIDATES, probs.shape[-1]))


def _top_k_kept(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The ids top-k keeps (every token tied with the k-th too), then top-p among them."""
    kth_largest = scaled.topk(min(params.top_k, scaled.numel())).values[-1]
    kept = (scaled >= kth_largest).nonzero().squeeze(-1)
    if params.top_p >= 1:
        return kept
    probs = scaled[kept].softmax(-1)
    # All the kept tokens are the candidates: their whole ranking.
    ranked, order = probs.sort(descending=True)
    return kept[_top_p_kept(probs, ranked, order, params.top_p)]


def _kept_probabilities(
    scaled: torch.Tensor, kept: torch.Tensor, min_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the kept ids in id order, their probabilities after min-p): the whole row's
    distribution where it is not 0."""
    ids = kept.sort().values
    probs = scaled[ids].softmax(-1)
    _min_p(probs, min_p)
    return ids, probs


def _draw_kept(
    scaled: torch.Tensor, kept: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> int:
    """A token drawn from the kept ids of one row of temperature-scaled logits, in id
    order (as the whole row's draw orders them), after min-p."""
    ids, probs = _kept_probabilities(scaled, kept, params.min_p)
    return int(ids[draw(probs, generator)])


def _min_p(probs: torch.Tensor, min_p: float) -> None:
    """In place: drop the tokens less likely than min_p times the top one, renormalized."""
    if min_p:
        probs[probs < min_p * probs.max()] = 0
        probs /= probs.sum()


def _probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One processed row's distribution after temperature, top-k, top-p and min-p, over
    the whole vocabulary (speculative verification's; a step's draws take _drawn's)."""
    scaled = logits / params.temperature
    kept = _kept(scaled, params)
    if kept is None:
        probs = scaled.softmax(-1)
        _min_p(probs, params.min_p)
        return probs
    ids, probs = _kept_probabilities(scaled, kept, params.min_p)
    return torch.zeros_like(scaled).index_copy_(0, ids, probs)


def _top_p_kept(
    probs: torch.Tensor, ranked: torch.Tensor, order: torch.Tensor, top_p: float
) -> torch.Tensor:
    """The ids of the fewest most likely tokens whose mass reaches top_p, from a row's
    probabilities and its TOP_P_CANDIDATES most likely (ranked, their ids in order).

    A token goes when those ranked above it already reach top_p, so the top
    token always stays. Sorting the whole vocabulary cost ~3.5 ms a row
    (49,152 tokens, one CPU thread, more than the rest of a sampled row). The
    kept tokens are ranked from a prefix of the full ranking instead: the
    candidates (topk, ~0.1 ms), which hold top_p's mass for most rows (SmolLM2
    at temperature 1: 93% of positions at top_p 0.9, 80% at 0.95), else every
    token above a floor lowered until their mass does (_ranked_reaching).
    Either prefix runs the full ranking's running mass.
    """
    running = ranked.cumsum(-1)
    if running[-1] < top_p:
        ranked, order = _ranked_reaching(probs, ranked[-1], top_p)
        running = ranked.cumsum(-1)
    return order[running - ranked < top_p]


def _ranked_reaching(
    probs: torch.Tensor, floor: torch.Tensor, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) of every token at or above the first floor
    whose tokens' mass reaches top_p, most likely first.

    The floor starts at the candidates' least likely and drops sixteenfold a
    try (a masked sum, ~60 us): every token top-p keeps lies above it, and
    those are sorted alone. A floor that reaches 0 takes the whole vocabulary.
    """
    while floor > 0 and torch.where(probs >= floor, probs, 0).sum() < top_p:
        floor = floor / 16
    ids = (probs >= floor).nonzero().squeeze(-1)
    ranked, order = probs[ids].sort(descending=True)
    return ranked, ids[order]
