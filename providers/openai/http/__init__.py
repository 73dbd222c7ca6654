"""The HTTP layer under the SDK: client pools per (target, key), the transport, the bounds of
one attempt (time, bytes), and admission when the process starves; and the policy as the
SDK's own HTTP client (`embedded`: `fallgate.http_client`, with `exchange` and `peek`).
"""
