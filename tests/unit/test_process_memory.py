"""The operator process's memory settings: botocore's models as plain dicts, glibc's arenas capped."""

from __future__ import annotations

import pytest

from speculator_operator import allocator
from speculator_operator.checkpoint.sources import s3_client


def test_the_s3_client_works_from_models_loaded_as_plain_dicts() -> None:
    creds = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = s3_client(creds)
    model = client.meta.service_model
    assert type(model._service_description) is dict
    assert "Range" in model.operation_model("GetObject").input_shape.members
    # the model drives the client: a signed ranged GET is rendered without the network
    url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "m/config.json"})
    assert url.startswith("http://127.0.0.1:9/b/m/config.json?")
    assert "X-Amz-Signature=" in url or "Signature=" in url


def test_arenas_are_capped_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert allocator.limit_arenas() is True  # glibc here
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert allocator.limit_arenas() is False  # glibc read the variable at start: it stands
