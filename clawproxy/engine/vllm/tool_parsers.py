"""vLLM tool-parser plugin ``qwen_fenced``: loaded by vLLM itself (``--tool-parser-plugin`` this
file, ``--tool-call-parser qwen_fenced``; ``engine.tool_call_parser: qwen_fenced`` does both).

It reads Qwen's ``<tool_call>`` calls as vLLM's ``hermes`` parser does, and also the fenced-JSON
and ``<tools>`` wrappers Qwen2.5-Coder-1.5B writes (``clawproxy/engine/toolcalls.py``). A call
streams as one delta with its whole arguments, once its wrapper closes: a call is small, and
a half-streamed call that then fails to parse could not be taken back.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

from clawproxy.engine.toolcalls import END_TOKENS, ToolCallScanner, tool_names


class QwenFencedToolParser(ToolParser):
    def __init__(self, tokenizer, tools=None):
        super().__init__(tokenizer, tools)
        self._scanner: ToolCallScanner | None = None
        ids = (tokenizer.convert_tokens_to_ids(t) for t in END_TOKENS)
        self._end_ids = {i for i in ids if isinstance(i, int) and i >= 0} | {tokenizer.eos_token_id}

    def extract_tool_calls(self, model_output: str, request: ChatCompletionRequest) -> ExtractedToolCallInformation:
        step = ToolCallScanner(tool_names(request.tools)).finish(model_output)
        calls = [ToolCall(id=make_tool_call_id(), type="function",
                          function=FunctionCall(name=c.name, arguments=c.arguments)) for c in step.calls]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                            content=step.content.strip() or None if calls else step.content)

    def extract_tool_calls_streaming(
        self, previous_text: str, current_text: str, delta_text: str, previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int], delta_token_ids: Sequence[int], request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        if self._scanner is None:
            self._scanner = ToolCallScanner(tool_names(request.tools))
        ended = any(t in self._end_ids for t in delta_token_ids)  # the last delta: release what is held
        step = self._scanner.finish(current_text) if ended else self._scanner.feed(current_text)
        deltas = []
        for call in step.calls:
            self.current_tool_id += 1
            self.prev_tool_call_arr.append({"name": call.name, "arguments": call.arguments})
            self.streamed_args_for_tool.append(call.arguments)
            deltas.append(DeltaToolCall(index=self.current_tool_id, id=make_tool_call_id(), type="function",
                                        function=DeltaFunctionCall(name=call.name, arguments=call.arguments)
                                        .model_dump(exclude_none=True)))
        if not deltas and not step.content:
            return None
        return DeltaMessage(content=step.content or None, tool_calls=deltas)


ToolParserManager.register_module("qwen_fenced", module=QwenFencedToolParser)
