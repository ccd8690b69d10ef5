"""`air serve openenv`'s options: those of every air episode server (air/services/episodes.py; the episode's own
are declared once, in EpisodeSettings). Light: the CLI builds its flags from this without importing OpenEnv."""

from __future__ import annotations

from air.services.episodes import ServiceConfig


class OpenEnvConfig(ServiceConfig):
    """OpenEnv's server takes nothing of its own beyond air's: its sessions are WebSockets, one episode each."""
