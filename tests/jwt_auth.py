"""Operator-mode credentials made in the test: operator, account and user NKeys and JWTs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _keypair(prefix: int):
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(seed)


def _jwt(claims: dict, signer) -> str:
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = dict(claims, iat=int(time.time()))
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode().rstrip("=")
    body = _b64(json.dumps(claims).encode())
    signature = _b64(signer.sign(f"{header}.{body}".encode()))
    return f"{header}.{body}.{signature}"


def make_operator_setup(name: str = "test") -> dict[str, str]:
    """Server config text and the user's .creds file content for one JetStream-enabled account."""
    _, operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    _, account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    _, system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user = _keypair(nkeys.PREFIX_BYTE_USER)
    op_pub, acc_pub, sys_pub, user_pub = (k.public_key.decode() for k in (operator, account, system, user))
    operator_jwt = _jwt({"iss": op_pub, "sub": op_pub, "name": name, "nats": {"type": "operator", "version": 2}},
                        operator)
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
              "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account_jwt = _jwt({"iss": op_pub, "sub": acc_pub, "name": "APP",
                        "nats": {"type": "account", "version": 2, "limits": limits}}, operator)
    system_jwt = _jwt({"iss": op_pub, "sub": sys_pub, "name": "SYS", "nats": {"type": "account", "version": 2}},
                      operator)
    user_jwt = _jwt({"iss": acc_pub, "sub": user_pub, "name": "spark",
                     "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1,
                              "payload": -1}}, account)
    config = (f'operator: "{operator_jwt}"\nsystem_account: {sys_pub}\nresolver: MEMORY\n'
              f'resolver_preload: {{ {acc_pub}: "{account_jwt}", {sys_pub}: "{system_jwt}" }}\n')
    creds = (f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
             f"-----BEGIN USER NKEY SEED-----\n{user_seed.decode()}\n------END USER NKEY SEED------\n")
    return {"config": config, "creds": creds, "user_seed": user_seed.decode()}
