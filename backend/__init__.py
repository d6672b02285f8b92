"""The serving runtime, importable and testable without Triton."""
