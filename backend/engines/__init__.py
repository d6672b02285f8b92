"""Target engines. Contract: `forward(batch) -> logits` with per-sequence ragged
token counts appended to a per-slot KV cache, plus `truncate`/`move_slot`."""
