"""clawproxy: personalize a self-hosted LLM just by talking to it.

The proxy path (``clawproxy.proxy``, ``clawproxy.store``, ``clawproxy.cli``) imports without torch;
the engine, judge and trainer import their heavy dependencies lazily.
"""

__version__ = "0.1.0"
