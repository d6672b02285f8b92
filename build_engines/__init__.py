"""Offline builds: convert the target checkpoint, (later) distill drafters, profile costs."""
