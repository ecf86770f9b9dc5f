"""LoRA adapters served on one base model (issue #34): loading PEFT folders,
the resident set an engine holds, and the batched low-rank products a step adds."""
