"""Reading the machine: cores, flags and limits from /proc/cpuinfo and cgroup text."""

from maas_services.common.machine_profile import (
    MachineProfile,
    machine_profile,
    parse_cpu_max,
    parse_cpuinfo,
)


def cpuinfo(*cpus: tuple[int, int, int], model: str, flags: str) -> str:
    """/proc/cpuinfo's text for (processor, physical id, core id) triples."""
    return "\n\n".join(
        f"processor\t: {processor}\nmodel name\t: {model}\nphysical id\t: {socket}\n"
        f"core id\t\t: {core}\nflags\t\t: {flags}"
        for processor, socket, core in cpus
    )


def test_two_core_epyc():
    text = cpuinfo((0, 0, 0), (1, 0, 1), model="AMD EPYC", flags="fma avx avx2 f16c")
    model, flags, cores = parse_cpuinfo(text, {0, 1})
    assert (model, cores) == ("AMD EPYC", 2)
    assert {"avx2", "fma"} <= flags


def test_smt_siblings_count_as_one_core_and_affinity_limits_them():
    # Two sockets of two cores, two hyperthreads each: 8 logical CPUs.
    cpus = [(p, p // 4, (p // 2) % 2) for p in range(8)]
    text = cpuinfo(*cpus, model="Intel Xeon", flags="avx512f amx_bf16")
    assert parse_cpuinfo(text, set(range(8)))[2] == 4
    assert parse_cpuinfo(text, {0, 1, 2})[2] == 2  # CPUs 0 and 1 are one core's siblings


def test_without_core_ids_every_allowed_cpu_is_a_core():
    text = "processor\t: 0\nflags\t: neon\n\nprocessor\t: 1\nflags\t: neon"
    assert parse_cpuinfo(text, {0, 1})[1:] == (frozenset({"neon"}), 2)


def test_cgroup_cpu_limit_caps_the_compute_cores():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("250000 100000\n") == 2.5
    machine = MachineProfile("x", frozenset(), cpus=64, physical_cores=32, cpu_quota=2.5)
    assert machine.compute_cores == 2
    assert MachineProfile("x", frozenset(), 4, 4, cpu_quota=0.5).compute_cores == 1


def test_this_machine_reads_something_consistent():
    machine = machine_profile()
    assert machine.cpu_model
    assert 1 <= machine.physical_cores <= machine.cpus
