"""Ray's token authentication, checked before a run joins a cluster (``--address``).

A cluster whose ``ray start`` found a token (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``
or the file at ``RAY_AUTH_TOKEN_PATH``), or ran with ``RAY_AUTH_MODE=token``, refuses
every gRPC call that does not carry that token (Ray >= 2.52). A driver joining it at an
explicit address sends the token only if its own ``RAY_AUTH_MODE`` is ``token``;
otherwise Ray retries for about 20 seconds and reports only "Failed to connect" (the
cause is in its log files), and ``RAY_AUTH_MODE=token`` without a token is a traceback.

:func:`check_token` asks the cluster's GCS once, without a token (one short gRPC call,
a few milliseconds): a refusal (``UNAUTHENTICATED``) means the cluster requires a token.
It then checks that this process will send one, and the right one, and otherwise raises
:class:`~dana.errors.DanaError` saying what to do. Anything else (an older Ray without
token support, a cluster without authentication, an unreachable address) is left to
``ray.init``.
"""

from __future__ import annotations

import os

from dana.errors import DanaError

#: Seconds to wait for the GCS's answer to the probe.
PROBE_SECONDS = 5.0

_HOW = (
    "get the token from the head node (`ray get-auth-token` there) and put it in "
    "~/.ray/auth_token on this machine (or set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to "
    "a file holding it), then `export RAY_AUTH_MODE=token` (see docs/DISTRIBUTED.md, "
    "'Token authentication')"
)


def token_mode() -> bool:
    """Whether this process runs Ray in token mode (``RAY_AUTH_MODE=token``)."""
    return os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token"


def local_token() -> str | None:
    """The token Ray would send from this process, whatever the mode; None if none."""
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return None
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    return loader.get_raw_token(ignore_auth_mode=True)


def probe(address: str, token: str | None) -> str | None:
    """Ask the GCS at ``HOST:PORT`` for its cluster id with ``token`` (None: without).

    Returns ``"ok"``, ``"refused"`` (the token is missing or wrong), ``"no-gcs"`` (a
    gRPC server without Ray's GCS service answered) or None (no answer that says
    anything about tokens).
    """
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    channel = grpc.insecure_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=PROBE_SECONDS, metadata=metadata
        )
        return "ok"
    except grpc.RpcError as e:
        answers = {
            grpc.StatusCode.UNAUTHENTICATED: "refused",
            grpc.StatusCode.UNIMPLEMENTED: "no-gcs",
        }
        return answers.get(e.code())
    finally:
        channel.close()


def check_token(address: str) -> None:
    """Raise :class:`DanaError` unless joining the cluster at ``address`` will pass its
    token authentication (if it has any). ``address``: ``HOST:PORT`` (other forms, such
    as ``auto``, are checked only for token mode without a token)."""
    token = local_token()
    if token_mode() and token is None:
        raise DanaError(f"RAY_AUTH_MODE=token is set but no Ray token was found: {_HOW}")
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    if probe(f"{host}:{port}", None) != "refused":
        return
    where = f"the Ray cluster at --address {address} requires token authentication"
    if token is None:
        raise DanaError(f"{where} and this machine has no token: {_HOW}")
    if probe(f"{host}:{port}", token) == "refused":
        raise DanaError(
            f"{where} and refuses this machine's token (it is another cluster's): {_HOW}"
        )
    if not token_mode():
        raise DanaError(
            f"{where}; this machine has its token but Ray sends it only in token mode: "
            "`export RAY_AUTH_MODE=token` and run the command again"
        )
