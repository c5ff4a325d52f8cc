#!/usr/bin/env python3
"""Computes the golden EKS tokens in eks_tokens.json with botocore.

The tokens are built the way `aws eks get-token` (awscli/customizations/eks/get_token.py)
builds them: an STS client for the region, an `x-k8s-aws-id` header injected before signing,
`generate_presigned_url('get_caller_identity', ExpiresIn=60, HttpMethod='GET')`, then
`k8s-aws-v1.` + urlsafe base64 of the URL with the `=` padding stripped. Only the signing
instant is pinned (botocore.auth.get_current_datetime), so the vectors are reproducible.

Usage: pip install botocore && python3 tests/golden/make_eks_tokens.py > tests/golden/eks_tokens.json
"""

import base64
import datetime
import json
import os
import sys
from unittest import mock

# Nothing from the machine running the script may leak into the vectors.
for name in list(os.environ):
    if name.startswith("AWS_"):
        del os.environ[name]
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
os.environ["AWS_STS_REGIONAL_ENDPOINTS"] = "regional"

import botocore  # noqa: E402
import botocore.auth  # noqa: E402
import botocore.session  # noqa: E402

K8S_AWS_ID_HEADER = "x-k8s-aws-id"
TOKEN_PREFIX = "k8s-aws-v1."
URL_TIMEOUT = 60
TOKEN_EXPIRATION_MINS = 14

# A realistic-looking session token with the characters that need percent-encoding.
SESSION_TOKEN = (
    "IQoJb3JpZ2luX2VjEJr//////////wEaCWV1LXdlc3QtMSJHMEUCIQDfakeSessionToken"
    "+Rk/Ab=9zZ3VpZGVk+AAA/BBB=="
)

CASES = [
    {
        "name": "eu-west-1 long-term credentials",
        "region": "eu-west-1",
        "cluster_name": "ironman-2022",
        "access_key_id": "AKIAIOSFODNN7EXAMPLE",
        "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "session_token": None,
        "signed_at": "2026-11-23T11:30:00Z",
    },
    {
        "name": "eu-west-1 session credentials",
        "region": "eu-west-1",
        "cluster_name": "ironman-2022",
        "access_key_id": "ASIAIOSFODNN7EXAMPLE",
        "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "session_token": SESSION_TOKEN,
        "signed_at": "2026-11-23T11:30:00Z",
    },
    {
        "name": "us-west-2 session credentials, other instant",
        "region": "us-west-2",
        "cluster_name": "prod_cluster-01",
        "access_key_id": "ASIAQUJRX4TESTKEYID2",
        "secret_access_key": "Zm9vYmFyYmF6cXV4K0FCQy9ERUY9MTIzNDU2Nzg5",
        "session_token": SESSION_TOKEN,
        "signed_at": "2024-02-29T23:59:59Z",
    },
    {
        "name": "us-west-2 long-term credentials",
        "region": "us-west-2",
        "cluster_name": "prod_cluster-01",
        "access_key_id": "AKIAQUJRX4TESTKEYID2",
        "secret_access_key": "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",
        "session_token": None,
        "signed_at": "2025-01-01T00:00:00Z",
    },
    {
        "name": "cn-north-1 (aws-cn partition) session credentials",
        "region": "cn-north-1",
        "cluster_name": "beijing",
        "access_key_id": "ASIACNEXAMPLEKEYID01",
        "secret_access_key": "cnSecretKey/EXAMPLE+0123456789abcdefABCD",
        "session_token": SESSION_TOKEN,
        "signed_at": "2026-06-15T08:00:00Z",
    },
    {
        "name": "us-gov-west-1 (aws-us-gov partition) long-term credentials",
        "region": "us-gov-west-1",
        "cluster_name": "govcloud",
        "access_key_id": "AKIAGOVEXAMPLEKEYID1",
        "secret_access_key": "govSecretKey/EXAMPLE+0123456789abcdefABCD",
        "session_token": None,
        "signed_at": "2026-06-15T08:00:00Z",
    },
]


def presigned_url(case):
    session = botocore.session.get_session()
    sts = session.create_client(
        "sts",
        region_name=case["region"],
        aws_access_key_id=case["access_key_id"],
        aws_secret_access_key=case["secret_access_key"],
        aws_session_token=case["session_token"],
    )

    # The same two handlers awscli registers: move the id out of the operation parameters
    # into the request context, then into a header just before signing.
    def retrieve_id(params, context, **_):
        if K8S_AWS_ID_HEADER in params:
            context[K8S_AWS_ID_HEADER] = params.pop(K8S_AWS_ID_HEADER)

    def inject_id(request, **_):
        if K8S_AWS_ID_HEADER in request.context:
            request.headers[K8S_AWS_ID_HEADER] = request.context[K8S_AWS_ID_HEADER]

    sts.meta.events.register("provide-client-params.sts.GetCallerIdentity", retrieve_id)
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", inject_id)

    signed_at = datetime.datetime.strptime(case["signed_at"], "%Y-%m-%dT%H:%M:%SZ")
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=signed_at):
        return sts.generate_presigned_url(
            "get_caller_identity",
            Params={K8S_AWS_ID_HEADER: case["cluster_name"]},
            ExpiresIn=URL_TIMEOUT,
            HttpMethod="GET",
        ), signed_at


def main():
    vectors = []
    for case in CASES:
        url, signed_at = presigned_url(case)
        token = TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode("utf-8")).decode("utf-8").rstrip("=")
        expiration = signed_at + datetime.timedelta(minutes=TOKEN_EXPIRATION_MINS)
        vectors.append(
            dict(
                case,
                url=url,
                token=token,
                expiration_timestamp=expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        )
    json.dump(
        {
            "generator": "tests/golden/make_eks_tokens.py",
            "botocore_version": botocore.__version__,
            "vectors": vectors,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
