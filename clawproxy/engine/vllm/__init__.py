"""vLLM: its OpenAI server started with our flags (``launch.py``), and the plugins it loads from here."""
