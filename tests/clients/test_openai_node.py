"""The official `openai` SDK for Node against a live stack: node/openai.test.mjs under `node --test`.

The SDK is pinned in node/package.json and node/package-lock.json and installed with `npm ci` by
scripts/install.sh (never here). Skipped only where there is no `node`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.clients.conftest import CHAT_PROMPT, COMPLETION_PROMPT, MAX_TOKENS, Answer
from tests.support.stack import MODEL

pytestmark = pytest.mark.e2e

NODE_DIR = Path(__file__).parent / "node"
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed: the openai SDK for Node cannot be checked")
def test_openai_sdk_for_node(base_url: str, chat_reference: Answer, completion_reference: Answer) -> None:
    assert (NODE_DIR / "node_modules/openai/package.json").is_file(), (
        "the openai SDK for Node is not installed: run `make install` (npm ci in tests/clients/node)"
    )
    case = {
        "baseURL": base_url,
        "model": MODEL,
        "maxTokens": MAX_TOKENS,
        "chatPrompt": CHAT_PROMPT,
        "completionPrompt": COMPLETION_PROMPT,
        "chat": asdict(chat_reference),
        "completion": asdict(completion_reference),
    }
    env = {**os.environ, "SWITCHBOARD_CLIENT_CASE": json.dumps(case)}
    argv = [str(NODE), "--test", "--test-reporter=spec", "openai.test.mjs"]
    done = subprocess.run(argv, cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    passed = re.search(r"^ℹ pass (\d+)$", report, re.MULTILINE)
    assert passed is not None and int(passed[1]) == 9, report[-3000:]
