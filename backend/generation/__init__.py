"""One generation request, whichever service runs it: what it asks, its state, its sampling, logits processors, stop words and detokenizing."""
