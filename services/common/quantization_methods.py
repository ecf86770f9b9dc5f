"""The weight-only quantization methods an engine takes, in one list.

The engine's --quantization flag, its QuantizationConfig and the
ModelDeployment CRD's enum all read this, so the operator can refuse a method
the engine does not have without importing the engine. The flag and the CRD
also take `auto`, the machine's choice (services/engine/machine_defaults.py),
which the engine resolves to a method before it loads the model.
"""

from typing import Literal, get_args

QuantizationMethod = Literal["none", "int8", "int4"]
QUANTIZATION_METHODS: tuple[QuantizationMethod, ...] = get_args(QuantizationMethod)
QuantizationSetting = Literal["auto", "none", "int8", "int4"]
QUANTIZATION_SETTINGS: tuple[QuantizationSetting, ...] = get_args(QuantizationSetting)
