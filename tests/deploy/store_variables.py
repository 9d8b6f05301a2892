"""The variables through which a worker gets a bucket's or the Hub's endpoint and credentials, asked
of the libraries that read them (botocore for `s3://`, huggingface_hub for `hf://`), so that a
deployment file naming one they do not read (a typo, another SDK's spelling) fails its test."""

from __future__ import annotations

import inspect
import os
import re
from functools import cache
from unittest import mock

# What a deployment hands over as a credential: never written into a file of this repository.
SECRET_STORE_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN"}
)


@cache
def botocore_variables() -> frozenset[str]:
    """Every variable botocore reads: its session's settings, the credentials' providers, and the
    endpoint (read through a provider of its own, so checked by what a client does with it)."""
    import boto3
    from botocore import configprovider, credentials

    names: set[str] = set()
    # botocore spells the table's name with a typo; the right spelling, should it be fixed.
    session_variables = getattr(configprovider, "BOTOCORE_DEFAUT_SESSION_VARIABLES", None)
    if session_variables is None:
        session_variables = configprovider.BOTOCORE_DEFAULT_SESSION_VARIABLES
    for _, env, *_ in session_variables.values():
        names.update([env] if isinstance(env, str) else env or [])
    provider = credentials.EnvProvider
    names.update([provider.ACCESS_KEY, provider.SECRET_KEY, *provider.TOKENS])
    names.update(credentials.AssumeRoleWithWebIdentityProvider._CONFIG_TO_ENV_VAR.values())
    endpoint = "http://127.0.0.1:9"
    with mock.patch.dict(os.environ, {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}):
        client = boto3.session.Session().client("s3")
    if client.meta.endpoint_url == endpoint:
        names.add("AWS_ENDPOINT_URL")
    return frozenset(names)


@cache
def huggingface_hub_variables() -> frozenset[str]:
    """Every HF_* variable huggingface_hub's settings read, and the token's own variable."""
    import huggingface_hub
    from huggingface_hub import constants

    names = set(re.findall(r"\"(HF_[A-Z_]+)\"", inspect.getsource(constants)))
    with mock.patch.dict(os.environ, {"HF_TOKEN": "hf_probe"}):
        if huggingface_hub.get_token() == "hf_probe":
            names.add("HF_TOKEN")
    return frozenset(names)


def store_variables() -> frozenset[str]:
    """Every variable the two libraries read."""
    return botocore_variables() | huggingface_hub_variables()
