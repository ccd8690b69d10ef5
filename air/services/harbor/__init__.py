"""Harbor integrations: air as a Harbor environment (environment.py, imported by Harbor's runner, never by air)."""
