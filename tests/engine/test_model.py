import torch

from clawproxy.engine.model import load_model_and_tokenizer, resolve_model


def test_default_model_converts_once_and_answers(default_model_dir):
    assert (default_model_dir / "model.safetensors").exists()
    assert resolve_model("default") == default_model_dir  # cached, not converted again
    model, tok = load_model_and_tokenizer(str(default_model_dir))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_tiny_model_loads(tiny_model_dir):
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape[-1] == len(tok)


def test_eos_ids_are_the_union_the_engine_and_the_gate_stop_on():
    from types import SimpleNamespace

    from clawproxy.engine.model import eos_token_ids

    vocab = {"<|im_end|>": 7, "<|endoftext|>": 0, "<|eot_id|>": 0}  # 0 is <unk>: not in the vocab
    tok = SimpleNamespace(eos_token_id=5, unk_token_id=0, convert_tokens_to_ids=lambda t: vocab[t])
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, 9]))
    assert eos_token_ids(model, tok) == {5, 7, 9}
    assert eos_token_ids(SimpleNamespace(), tok) == {5, 7}


def test_default_model_stops_on_im_end_only(default_model_dir):
    from clawproxy.engine.model import eos_token_ids

    model, tok = load_model_and_tokenizer(str(default_model_dir))
    assert eos_token_ids(model, tok) == {tok.convert_tokens_to_ids("<|im_end|>")}
