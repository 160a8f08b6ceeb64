"""Secret shapes a client can send, each with a fresh random value: by format (keys of known
services), by name (JSON members in other spellings and types), nested (JSON inside tool-call
arguments and tool results) and in text (.env lines, URLs, headers). Used by the redaction tests
and by bench/secrets_probe.py, which greps the data dir for every value."""

from __future__ import annotations

import base64
import json
import random
import string
from typing import Any

ALNUM = string.ascii_letters + string.digits


def rand(n: int, alphabet: str = ALNUM, rng: random.Random | None = None) -> str:
    r = rng or random
    while True:  # mixed case and digits, as real keys are (and the AWS rule requires)
        s = "".join(r.choice(alphabet) for _ in range(n))
        if alphabet != ALNUM or (any(c.isupper() for c in s) and any(c.islower() for c in s)
                                 and any(c.isdigit() for c in s)):
            return s


def _b64url(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def shapes(rng: random.Random | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, the secret's characters, a chat request body carrying it)."""
    def r(n: int, alphabet: str = ALNUM) -> str:
        return rand(n, alphabet, rng)

    out: list[tuple[str, str, dict[str, Any]]] = []

    def text(label: str, secret: str, carrier: str) -> None:
        out.append((label, secret, _chat(carrier)))

    def member(label: str, secret: Any, **fields: Any) -> None:
        out.append((label, str(secret), {**_chat(f"see {label}"), **fields}))

    # by format, in what the user typed (the fake upstream echoes it, so the response has it too)
    for label, secret in [
        ("openai", "sk-proj-" + r(40)), ("anthropic", "sk-ant-api03-" + r(60)),
        ("github_ghp", "ghp_" + r(36)), ("github_pat", "github_pat_" + r(60)),
        ("github_gho", "gho_" + r(36)), ("slack", "xoxb-" + r(12, string.digits) + "-" + r(24)),
        ("huggingface", "hf_" + r(34)), ("aws_key_id", "AKIA" + r(16, string.ascii_uppercase + string.digits)),
        ("aws_secret_bare", r(30) + "/" + r(4) + "+" + r(4)), ("google", "AIza" + r(35)),
        ("google_oauth", "ya29." + r(40)), ("gitlab", "glpat-" + r(20)),
        ("jwt", _b64url({"alg": "HS256"}) + "." + _b64url({"sub": r(8)}) + "." + r(43)),
        ("stripe_live", "sk_live_" + r(24)), ("stripe_restricted", "rk_live_" + r(24)),
        ("stripe_webhook", "whsec_" + r(32)), ("npm", "npm_" + r(36)),
        ("pypi", "pypi-AgEIcHlwaS5vcmc" + r(60)), ("sendgrid", "SG." + r(22) + "." + r(43)),
        ("docker", "dckr_pat_" + r(27)),
    ]:
        text(label, secret, f"{secret} is my key, keep it safe")
    tok = r(32)
    text("bearer_header_text", tok, f"curl -H 'Authorization: Bearer {tok}' https://api.example")
    basic = base64.b64encode(f"admin:{r(12)}".encode()).decode()
    text("basic_auth", basic, f"Authorization: Basic {basic}")
    pw = r(14)
    text("url_userinfo", pw, f"connect to postgres://admin:{pw}@db.internal:5432/prod")
    pem = r(64)
    text("pem", pem, f"-----BEGIN RSA PRIVATE KEY-----\n{pem}\n-----END RSA PRIVATE KEY-----")
    v = r(18)
    text("dotenv", v, f"my .env says\nDB_PASSWORD={v}\nDEBUG=1")
    v = r(22)
    text("export_token", v, f"export GITHUB_TOKEN={v}")
    v = r(20)
    text("query_token", v, f"open https://x.example/cb?access_token={v}&state=1")
    v = r(6) + "7"
    text("yaml_password", v, f"db:\n  password: {v}\n")

    # by name: JSON members, any spelling, any type
    for name in ("token", "session_token", "secret_key", "aws_secret_access_key", "db_password",
                 "Password", "PASSWORD", "x-api-key", "apiKey", "client_secret", "refresh_token"):
        v = r(24)
        member(f"member_{name}", v, metadata={name: v})
    v = r(20)
    member("member_auth_token", v, metadata={"auth": {"token": v}})
    n = rng.randrange(10**11, 10**12) if rng else random.randrange(10**11, 10**12)
    member("member_password_number", n, metadata={"password": n})

    # nested: JSON inside tool-call arguments and tool results
    for label, args in [("tool_args_password", "password"), ("tool_args_api_key", "api_key")]:
        v = r(24)
        body = _chat("run the tool")
        body["messages"][1:1] = [
            {"role": "user", "content": "set it up"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "configure", "arguments": json.dumps({"config": {args: v, "retries": 3}})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        out.append((label, v, body))
    for label, key in [("tool_result_token", "token"), ("tool_result_secret", "secret")]:
        v = r(24)
        body = _chat("what did it say")
        body["messages"][1:1] = [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {
                "name": "read", "arguments": "{\"path\": \"creds.json\"}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": json.dumps([{key: v, "user": "bob"}])}]
        out.append((label, v, body))
    v = r(20)
    body = _chat("and this file")
    body["messages"][1:1] = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c3", "type": "function", "function": {
            "name": "read", "arguments": "{\"path\": \".env\"}"}}]},
        {"role": "tool", "tool_call_id": "c3", "content": f"API_KEY={v}\nPORT=8080\n"}]
    out.append(("tool_result_dotenv", v, body))
    return out


def _chat(text: str) -> dict[str, Any]:
    return {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]}


# What must stay as it is: token counts and ids, and ordinary words.
CLEAN = {"model": "m", "stream": True, "max_tokens": 77, "max_completion_tokens": 77,
         "stream_options": {"include_usage": True},
         "messages": [{"role": "system", "content": "sys"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                          "name": "count", "arguments": "{\"max_tokens\": 5, \"token_count\": 3, \"tokens\": [1, 2]}"}}]},
                      {"role": "tool", "tool_call_id": "c", "content": "{\"prompt_tokens\": 12, \"author\": \"ann\"}"},
                      {"role": "user", "content": "I need 5 tokens and a basic understanding; the secret: patience. "
                                                  "See https://example.com/a:b@c and commit 0123456789abcdef0123456789abcdef01234567"}]}
