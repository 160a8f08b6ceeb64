"""The engines that serve the model, over a shared core.

Each engine has a folder: ``vllm/`` (the default: vLLM's own OpenAI server, started with our flags and
plugins), ``llamacpp/`` (llama.cpp's llama-server behind clawproxy's engine server) and ``embedded/``
(the transformers fallback behind the same server). What they share stays here: the model files
(``model.py``), the client every caller drives them with (``client.py``), the one tool-call reader
(``toolcalls.py``), and clawproxy's engine server (``server.py``, ``tools.py``, ``generation.py``).
What each engine can do and which one serves are below this package (``clawproxy/engine_spec.py``,
``clawproxy/engine_choice.py``), so the config reads them without importing an engine.
"""
