"""Layer 1: Docker containers, shells and pools. Knows nothing about tasks or RL."""
