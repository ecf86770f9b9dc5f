"""Weight-only quantization of the engine's linear layers (int8 per channel, int4 per group).

The formats are kernels/quant_int8_ref.py's and kernels/quant_int4_ref.py's;
this package decides which layers to quantize, where the quantized values
come from (float weights, or a GGUF file's own 4-bit blocks) and which matmul
runs them on each device. Activations stay in the model dtype.
"""
