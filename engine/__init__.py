"""specchat's engine: speculative decoding over Hugging Face causal LMs.

Token ids in, events out; nothing here imports a UI. The terms used throughout
come from Leviathan et al. (2022) and Chen et al. (2023):

* **K**  – how many tokens the drafter proposes per round.
* **α**  – acceptance rate: draft tokens accepted / draft tokens proposed.
* **τ**  – mean tokens emitted per target forward pass (accepted drafts plus the
  one token the target adds itself each round); plain decoding has τ = 1.
"""
