"""The default policy: what `fallgate diagram` / `check` show when given no file.

A realistic chain (a primary and three fallbacks, two keys each, read from
environment variables at use time), so the committed diagrams show the shape
of a real deployment. Each base_url comes from the provider registry
(`fsm.catalogue.registry`). Nothing here reads the environment or the network.
"""

from __future__ import annotations

from typing import Any, Final

from .model import Policy

#: The default policy as plain data, in the same shape a TOML file has.
DEFAULT_POLICY: Final[dict[str, Any]] = {
    "max_attempts": 3,
    "primary": {
        "provider": "openai",
        "model": "gpt-4.1",
        "context_length": 1_000_000,
        "key_envs": ["OPENAI_API_KEY", "OPENAI_API_KEY_2"],
    },
    "fallback_providers": [
        {
            "provider": "zai",
            "model": "glm-4.7",
            "context_length": 200_000,
            "key_envs": ["ZAI_API_KEY", "ZAI_API_KEY_2"],
        },
        {
            "provider": "openrouter",
            "model": "deepseek/deepseek-chat",
            "context_length": 128_000,
            "key_envs": ["OPENROUTER_API_KEY", "OPENROUTER_API_KEY_2"],
        },
        {
            "provider": "groq",
            "model": "llama-3.3-70b-versatile",
            "context_length": 128_000,
            "key_envs": ["GROQ_API_KEY", "GROQ_API_KEY_2"],
        },
    ],
}


def default_policy() -> Policy:
    """A fresh `Policy` built from `DEFAULT_POLICY`."""
    return Policy.from_dict(DEFAULT_POLICY, source="default policy")
