"""Talking to models: the async OpenAI-compatible client, rate limits, replicas, local vLLM serving."""
