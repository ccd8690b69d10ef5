"""Services air runs beside its sandboxes, for trainers outside verifiers: SandboxFusion's code-running API
(verl), AgentGym's environment servers and OpenEnv (TRL, torchforge, SkyRL), on one shared episode core."""
