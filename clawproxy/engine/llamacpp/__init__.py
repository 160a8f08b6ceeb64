"""llama.cpp: llama-server built from a pinned source, behind clawproxy's engine server."""
