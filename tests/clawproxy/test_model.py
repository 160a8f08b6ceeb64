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
