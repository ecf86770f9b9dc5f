"""The weight-only quantization methods an engine takes, in one list.

The engine's --quantization flag, its QuantizationConfig and the
ModelDeployment CRD's enum all read this, so the operator can refuse a method
the engine does not have without importing the engine.
"""

from typing import Literal, get_args

QuantizationMethod = Literal["none", "int8", "int4"]
QUANTIZATION_METHODS: tuple[QuantizationMethod, ...] = get_args(QuantizationMethod)
