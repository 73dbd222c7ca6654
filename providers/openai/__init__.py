"""The openai-compatible client: `Fallgate` / `AsyncFallgate`, their resources and calls,
streams, usage, and the reader of what the SDK raises.
"""
