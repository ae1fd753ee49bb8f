"""The target and draft models as tensors: the device, the lean forward, transformers compatibility, the memory plan. Depends on config and quant."""
