"""The LLM voter run in-process with transformers, for measuring small models without a server.

Same prompt, sampling and parsing as ``LLMVoter``; only ``complete`` differs. Used by
``clawproxy judge eval --voter llm --local-model default`` to put a figure on the claim that the
135M default model is not a judge.
"""

from __future__ import annotations

import threading
from typing import Any

from judge.voters import LLMVoter


class LocalLLMVoter(LLMVoter):
    name = "llm"

    def __init__(self, spec: str, data_dir: Any = None, temperature: float = 0.7,
                 max_tokens: int = 200, seed: int = 0) -> None:
        super().__init__("local://" + spec, model=spec, temperature=temperature, max_tokens=max_tokens)
        import torch

        from clawproxy.engine.model import load_model_and_tokenizer

        self.model_obj, self.tokenizer = load_model_and_tokenizer(spec, data_dir)
        self._lock = threading.Lock()
        torch.manual_seed(seed)

    def complete(self, messages: list[dict[str, str]], n: int = 1) -> list[str]:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        with self._lock, torch.no_grad():
            out = self.model_obj.generate(
                **ids,
                max_new_tokens=self.max_tokens,
                do_sample=self.temperature > 0,
                temperature=self.temperature if self.temperature > 0 else None,
                top_p=None, top_k=None,
                pad_token_id=self.tokenizer.pad_token_id,
                num_return_sequences=n,
            )
        return self.tokenizer.batch_decode(out[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)
