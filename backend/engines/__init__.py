"""Target engines. Every engine implements the contract in `contract.py` (`Engine`):
a ragged forward over a slotted KV cache with logits on chosen rows, `truncate`,
`move_slot`, limits and KV cost metadata; tests/backend/test_engine_contract.py is
the one suite each engine passes. `torch_llama.TorchLlama` is the torch engine."""
from .contract import Engine, ModelShape

__all__ = ["Engine", "ModelShape"]
