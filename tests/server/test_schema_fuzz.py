"""Schema fuzzing: schemathesis draws requests from TGI's OpenAPI document for every operation and
sends them to the real HTTP server (uvicorn, the real router and tokenizer, `FakeEngine`): no
answer may be a 5xx, and every success must conform to TGI's response schema (issue 13).

The number of examples is bounded (and derandomized) so that the test stays within CI's budget;
TGI's document is read from the shared reference folder when it is there, else this is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from server.harness import serve

EXAMPLES_PER_OPERATION = 25
_REFERENCE = Path("shared") / "reference" / "tgi-openapi.json"
TGI_OPENAPI = next(
    (p / _REFERENCE for p in Path(__file__).resolve().parents if (p / _REFERENCE).exists()), None
)

pytestmark = pytest.mark.skipif(TGI_OPENAPI is None, reason="TGI's OpenAPI document not available")


def _as_openapi_30(node: Any) -> Any:
    """TGI's 3.0 document writes `exclusiveMinimum: X` (3.1 style); 3.0 wants a boolean."""
    if isinstance(node, list):
        return [_as_openapi_30(n) for n in node]
    if not isinstance(node, dict):
        return node
    converted = {k: _as_openapi_30(v) for k, v in node.items()}
    bound = converted.get("exclusiveMinimum")
    if isinstance(bound, int | float) and not isinstance(bound, bool):
        converted.update(minimum=bound, exclusiveMinimum=True)
    return converted


def _operations() -> list:
    if TGI_OPENAPI is None:
        return []
    import schemathesis

    document = _as_openapi_30(json.loads(TGI_OPENAPI.read_text()))
    schema = schemathesis.openapi.from_dict(document)
    return [result.ok() for result in schema.get_all_operations()]


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def fuzz_url(tokenizer, tmp_path_factory):
    from server.fakes import CACHE_INFO, FakeEngine
    from server.harness import SCRIPT, server_config

    from pytgi.router.infer import Infer
    from pytgi.server.app import create_app

    ids = tokenizer.encode(SCRIPT, add_special_tokens=False).ids + list(tokenizer.eos_token_ids)
    engine = FakeEngine(ids)
    config = server_config()
    infer = Infer(engine, tokenizer, config.limits, CACHE_INFO)
    app = create_app(infer, engine, config, CACHE_INFO, model_info={"model_id": "fuzz"})
    with serve(app) as url:
        yield url


# where TGI's runtime (which pytgi follows, TGI_COMPATIBILITY.md §10) answers otherwise than its
# document
RUNTIME_SHAPES = {
    "/invocations": "`[GenerateResponse]` for a generate request, as `/` (document: an object)",
    "/v1/models": '`{"object": "list", "data": [ModelInfo]}` (document: a bare ModelInfo)',
}


def _documented(operation, response) -> bool:
    """Whether TGI's document describes this response (SSE streams are not in it)."""
    if "json" not in response.headers.get("content-type", [""])[0]:
        return False
    if operation.path == "/invocations":
        return not response.text.startswith("[")
    return operation.path not in RUNTIME_SHAPES


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method} {op.path}")
def test_fuzzed_requests_get_no_5xx_and_conforming_successes(operation, fuzz_url):
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def check(case):
        response = case.call(base_url=fuzz_url, timeout=30)
        checks = [not_a_server_error]
        if _documented(operation, response):
            checks.append(response_schema_conformance)
        case.validate_response(response, checks=checks)

    check()
