"""What clients and Triton talk to: the launcher, the HTTP edge and OpenAI API, the Triton adapters, the metrics."""
