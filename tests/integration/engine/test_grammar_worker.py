"""The grammar worker process (services/common/grammar/worker.py) against SmolLM2's vocabulary.

Outcomes, not times: a compile past its deadline is refused and its process
gone, the next compile works in a new one; a compile over its memory cap is
refused; the cost caps let through only grammars whose compile CPU stays
under the production deadline (a Hypothesis fuzz of grammar shapes).
"""

import os
import signal
from dataclasses import replace

import pytest
import xgrammar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maas_services.common.grammar import cost
from maas_services.common.grammar.compiler import GrammarCompiler
from maas_services.common.grammar.spec import GrammarError, GrammarSpec
from maas_services.common.grammar.vocab import tokenizer_info
from maas_services.common.grammar.worker import CompileFailed, GrammarWorker, WorkerLimits

# Under the caps, and a second or more of CPU on this vocabulary: far past 50 ms.
SLOW = GrammarSpec("ebnf", 'root ::= [^"\\nab]{0,64}')
# Generous wall time: the fuzz asserts on the compile's CPU seconds, which
# another tenant's load on the host does not stretch.
PATIENT = WorkerLimits(deadline_s=300)


@pytest.fixture(scope="module")
def info(tokenizer) -> xgrammar.TokenizerInfo:
    return tokenizer_info(tokenizer)


@pytest.fixture(scope="module")
def patient(info):
    worker = GrammarWorker(info.serialize_json(), PATIENT)
    yield worker
    worker.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_compile_past_its_deadline_is_killed_and_the_next_one_gets_a_new_worker(info):
    compiler = GrammarCompiler(info, WorkerLimits(deadline_s=0.05))
    first = compiler.worker.pid
    with pytest.raises(CompileFailed, match="did not compile within 0.05 s") as refused:
        compiler.compile(SLOW, tenant="a")
    assert not alive(first)  # killed and reaped before the caller heard
    assert refused.value.cpu_seconds >= 0
    compiler.worker.limits = PATIENT
    compiled = compiler.compile(GrammarSpec("regex", "ab+"), tenant="a")
    assert xgrammar.GrammarMatcher(compiled).accept_string("abb")
    assert compiler.worker.pid not in (None, first)
    compiler.worker.close()


def test_a_worker_that_died_is_replaced_on_the_next_compile(patient):
    patient.start()
    os.kill(patient.pid, signal.SIGKILL)
    os.waitid(os.P_PID, patient.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
    compiled = patient.compile(GrammarSpec("regex", "[xy]z"))
    assert compiled.grammar_json and alive(patient.pid)


def test_a_compile_over_its_memory_cap_is_refused(info):
    worker = GrammarWorker(info.serialize_json(), replace(PATIENT, memory_bytes=8 << 20))
    with pytest.raises(CompileFailed, match="memory"):
        worker.compile(GrammarSpec("ebnf", 'root ::= [^"\\nab]{0,128}'))
    worker.close()


def test_the_cache_answers_only_the_tenant_that_compiled(info):
    compiler = GrammarCompiler(info, PATIENT)
    spec = GrammarSpec("regex", "[a-c]{2}x")
    assert compiler.cached(spec, "a") is None
    compiler.compile(spec, tenant="a")
    assert compiler.cached(spec, "a") is not None
    assert compiler.cached(spec, "b") is None  # no timing oracle across tenants
    _, seconds = compiler.compile_counted(spec, "a")
    assert seconds == 0.0
    compiler.worker.close()


def test_an_over_cap_grammar_is_refused_by_the_worker_naming_the_limit(patient):
    attack = "root ::= " + " ".join(f"r{i}" for i in range(10)) + "\n"
    attack += "\n".join(f'r{i} ::= [^"\\nab]{{4,128}}' for i in range(10))
    with pytest.raises(CompileFailed, match=r"add up to 1280 after parsing; at most 256"):
        patient.compile(GrammarSpec("ebnf", attack))


# Wide classes (each a different one: xgrammar shares the work of equal ones)
# and narrow ones, repeated up to past the cap.
CLASSES = ['[^"\\nab]', '[^"\\ncd]', '[^"\\nef]', "[a-z]", "[0-9A-F]", '[^"]']


@st.composite
def grammars(draw) -> GrammarSpec:
    rules = draw(st.integers(1, 6))
    body = []
    for i in range(rules):
        item = draw(st.sampled_from(CLASSES))
        low = draw(st.integers(0, 4))
        high = draw(st.integers(low, 200))
        body.append(f"r{i} ::= {item}{{{low},{high}}}")
    root = "root ::= " + " ".join(f"r{i}" for i in range(rules))
    return GrammarSpec("ebnf", "\n".join([root, *body]))


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=grammars())
def test_no_grammar_the_caps_accept_compiles_past_the_deadline(patient, spec):
    try:
        cost.measure(cost.parse(spec)).check()
    except GrammarError as exc:
        assert "at most" in str(exc)
        return
    compiled = patient.compile(spec)
    assert compiled.cpu_seconds < WorkerLimits().deadline_s, spec.text
