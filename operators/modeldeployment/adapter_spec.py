"""Typed views of spec.adapters, and the refusals the CRD schema cannot say.

The schema bounds each adapter (name pattern, file:// or pvc:// source, at most
MAX_ADAPTERS, one per name by the API server's list-map). What needs the
resource's name, or a check where no API server runs (`maas operator simulate`),
is here: an adapter named as the model's id or an alias would be a second
meaning of one name, and a name given twice two.
"""

from dataclasses import dataclass

from maas_operator.modeldeployment.admission import Refusal
from maas_operator.modeldeployment.crd_schema import PRELOAD
from maas_operator.modeldeployment.model_source import local_path
from maas_operator.modeldeployment.spec import model_id


@dataclass(frozen=True)
class Adapter:
    name: str
    uri: str
    path: str  # the PEFT folder as the engines see it
    tenants: tuple[str, ...]
    load: str  # preload | on-demand

    @property
    def preload(self) -> bool:
        return self.load == PRELOAD


def adapters(spec: dict) -> list[Adapter]:
    """spec.adapters of a (defaulted) spec, in the spec's order."""
    return [
        Adapter(
            name=a["name"],
            uri=a["source"]["uri"],
            path=local_path(a["source"]["uri"]),
            tenants=tuple(a.get("tenants") or ()),
            load=a["load"],
        )
        for a in spec.get("adapters") or []
    ]


def lora_modules(spec: dict) -> list[str]:
    """The preload adapters as the engine's --lora-modules spells them: NAME=PATH."""
    return [f"{a.name}={a.path}" for a in adapters(spec) if a.preload]


def lora_wanted(spec: dict) -> bool:
    """Whether the engines serve adapters: some are declared, or maxLoras asks for room."""
    return bool(spec.get("adapters")) or spec["engine"].get("maxLoras", 0) > 0


def adapter_refusal(name: str, spec: dict) -> Refusal | None:
    """Why the spec's adapters may not run on ModelDeployment `name`, or None."""
    model = model_id(name, spec)
    taken = {model: "the model's id", **{a: "an alias" for a in spec.get("aliases") or []}}
    seen: set[str] = set()
    for i, adapter in enumerate(adapters(spec)):
        field = f"spec.adapters[{i}].name {adapter.name!r}"
        if adapter.name in seen:
            return Refusal("AdapterNameConflict", f"{field} is given twice")
        if adapter.name in taken:
            return Refusal(
                "AdapterNameConflict",
                f"{field} is {taken[adapter.name]} of this ModelDeployment: a request for "
                "it could not say whether it means the adapter",
            )
        seen.add(adapter.name)
    return None
