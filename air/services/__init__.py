"""Services air runs beside its sandboxes: a SandboxFusion-compatible code runner, and a managed upstream one."""
