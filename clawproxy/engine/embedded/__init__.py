"""The embedded engine: transformers in this process, behind clawproxy's engine server (the fallback)."""
