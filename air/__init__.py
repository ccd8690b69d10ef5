"""air: Docker-sandboxed environments for training LLM research agents with reinforcement learning."""

__version__ = "0.1.0"
