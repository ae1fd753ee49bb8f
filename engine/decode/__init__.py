"""Speculative decoding over token ids: the KV-cache owner, drafters, verification, sampling, the K schedule and the costs behind it. Depends on model."""
